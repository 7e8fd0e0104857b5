"""``serve`` wires the effects: the hook, the API they write through, the flags."""

from pathlib import Path

import pytest

from app.cli import build_parser
from app.config import SettingsError
from app.effects import Effects, LogOnlyApi
from app.serve import build_context
from app.startup import UsageError

DEMO = str(Path(__file__).resolve().parents[2] / "examples" / "demo-snapshot.yaml")


def args(*extra):
    return build_parser().parse_args(["serve", "--tls-cert", "c", "--tls-key", "k", "--snapshot", DEMO, *extra])


def test_snapshot_mode_runs_the_effects_pipeline_and_logs_what_it_would_write():
    ctx = build_context(args())
    assert isinstance(ctx.effects, Effects) and isinstance(ctx.effects.api, LogOnlyApi)
    assert ctx.on_decision == ctx.effects.on_decision
    assert ctx.effects.queue.metrics is ctx.metrics  # effects count into the served registry
    assert ctx.effects.events.interval == 60 and ctx.effects.queue.capacity == 1000


def test_flags_tune_and_disable_the_effects():
    ctx = build_context(args("--event-interval", "5m", "--side-effect-queue", "10"))
    assert ctx.effects.events.interval == 300 and ctx.effects.queue.capacity == 10
    off = build_context(args("--no-side-effects"))
    assert off.effects.events is None and off.effects.annotate is False


@pytest.mark.parametrize("flag,value", [("--event-interval", "soon"), ("--event-interval", "-1m")])
def test_bad_effect_flags_stop_start_up_naming_the_flag(flag, value):
    with pytest.raises((SettingsError, UsageError)) as e:
        build_context(args(f"{flag}={value}"))
    assert flag in str(e.value)


def test_a_queue_of_nothing_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:  # argparse: the type check of --side-effect-queue
        args("--side-effect-queue=0")
    assert e.value.code == 2 and "argument --side-effect-queue" in capsys.readouterr().err
