"""``explain`` and ``report``: one judgement (``policy.decide``), shown for one pod or for every VM,
as text, JSON or YAML."""

from app.inspect.explain import explain, explanation
from app.inspect.report import migration_history, report, report_model

__all__ = ["explain", "explanation", "migration_history", "report", "report_model"]
