"""RFC 3339 timestamps as Go's time.Parse reads them, on the fast path Kubernetes' own format takes and off it."""

from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from app.timefmt import parse_timestamp

DIGITS = st.sampled_from("0123456789")
ODD = st.sampled_from("0123456789 +-:TZtz.,W٣")  # a few characters Go refuses where digits belong


def _shape(chars: list[str]) -> str:
    """YYYY-MM-DDTHH:MM:SSZ, Kubernetes' metav1.Time, from 14 characters for the digit places."""
    y, mo, d, h, mi, s = "".join(chars[:4]), "".join(chars[4:6]), "".join(chars[6:8]), "".join(chars[8:10]), \
        "".join(chars[10:12]), "".join(chars[12:14])
    return f"{y}-{mo}-{d}T{h}:{mi}:{s}Z"


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.one_of(DIGITS, DIGITS, DIGITS, ODD), min_size=14, max_size=14))
def test_kubernetes_shape_reads_as_the_same_instant_written_with_an_offset(chars: list[str]) -> None:
    text = _shape(chars)
    fast = parse_timestamp(text)
    general = parse_timestamp(text[:-1] + "+00:00")  # not the fast path's shape: the general parser
    assert fast == general, (text, fast, general)


@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)))
def test_every_valid_instant_reads_back(dt: datetime) -> None:
    dt = dt.replace(microsecond=0, tzinfo=timezone.utc)
    text = f"{dt.year:04d}-{dt:%m-%dT%H:%M:%S}Z"
    assert parse_timestamp(text) == dt.timestamp(), text


def test_what_go_refuses_is_none_on_the_fast_path_too() -> None:
    for text in ("2026-02-30T00:00:00Z", "2026-01-01T24:00:00Z", "2026-01-01T00:60:00Z", "2026-01-01T00:00:60Z",
                 "0000-01-01T00:00:00Z", "2026-W01-1T00:00:00Z", "2026-01-01t00:00:00Z", "2026-01-01T00:00:00z",
                 "2026-01-01 00:00:00Z", "+026-01-01T00:00:00Z", "2026-1-01T00:00:00ZZ"):
        assert parse_timestamp(text) is None, text
    assert parse_timestamp("2026-01-01T00:00:00Z") == datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp()
    assert parse_timestamp("2026-01-01T1:00:00Z") == datetime(2026, 1, 1, 1, tzinfo=timezone.utc).timestamp()
