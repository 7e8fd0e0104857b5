"""Coverage-guided fuzzing (atheris/libFuzzer) of the two parsers that take untrusted bytes.

    make fuzz                      # both targets, 60 s each
    python fuzz/fuzz_targets.py admission -max_total_time=600

A target fails only on an exception that is not the parser's own error type
(or on a crash): every input must decode, or be rejected with BadReview /
SnapshotError. The admission target also runs policy on what decodes.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from app.admission import review as rv
    from app.cluster.snapshot import SnapshotError, load_snapshot
    from app.cluster.store import ClusterStore
    from app.policy import PolicySettings, decide

STORE, SETTINGS = ClusterStore(), PolicySettings()
TMP = Path(tempfile.mkdtemp()) / "snapshot"


def admission(data: bytes) -> None:
    try:
        review = rv.decode(data)
    except rv.BadReview:
        return
    rv.respond(review, decide(review.eviction, STORE, 0.0, SETTINGS))


def snapshot(data: bytes) -> None:
    TMP.write_bytes(data)
    try:
        load_snapshot(TMP)
    except SnapshotError:
        pass


TARGETS = {"admission": admission, "snapshot": snapshot}

if __name__ == "__main__":
    target = TARGETS[sys.argv[1]]
    atheris.Setup([sys.argv[0], *sys.argv[2:]], target)
    atheris.Fuzz()
