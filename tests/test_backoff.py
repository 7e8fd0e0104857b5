"""The one backoff policy of the watch loops and the side-effect queue."""

from __future__ import annotations

import pytest

from app.backoff import EQUAL, FULL, Backoff


@pytest.mark.parametrize("attempt, ceiling", [(1, 0.8), (2, 1.6), (3, 3.2), (6, 25.6), (7, 30.0), (1000, 30.0)])
def test_doubling_up_to_the_cap(attempt, ceiling) -> None:
    b = Backoff(0.8, 30.0, EQUAL)
    assert b.delay(attempt, lambda: 1.0) == pytest.approx(ceiling)
    assert b.delay(attempt, lambda: 0.0) == pytest.approx(ceiling / 2)  # equal jitter: never below half


def test_full_jitter_spans_zero_to_the_ceiling() -> None:
    b = Backoff(0.5, 30.0, FULL)
    assert b.delay(3, lambda: 0.0) == 0.0 and b.delay(3, lambda: 1.0) == pytest.approx(2.0)
