"""Refuse a DeschedulerPolicy the descheduler would not read in full.

The descheduler decodes its policy file leniently: a key its ``v1alpha2`` types do not have (``preEvictionFilter``
for ``preevictionfilter``, a misplaced limit) is dropped without a word, and the run silently measures another
policy than the one written. ``e2e/policycheck`` (a small Go program in the e2e module, so it is compiled against
the very descheduler the e2e binaries are built from) decodes the file strictly against those types, then loads it
through the descheduler's own ``LoadPolicyConfig`` with its default plugins. It is built on first use into
``build/e2e/policycheck`` with Go's build cache (the descheduler's packages are compiled already by ``e2e/build.sh``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from pathlib import Path

from tests.e2e.controlplane import ROOT

SOURCE = ROOT / "e2e" / "policycheck"
_lock = threading.Lock()


class PolicyRejected(RuntimeError):
    """The descheduler would drop part of this policy, or refuse it."""


def checker() -> Path:
    """The checker binary, built if missing or older than its source or the module's pins."""
    key = hashlib.sha256(b"".join(p.read_bytes() for p in (
        SOURCE / "main.go", ROOT / "e2e" / "go.mod", ROOT / "e2e" / "go.sum"))).hexdigest()[:16]
    out = ROOT / "build" / "e2e" / f"policycheck-{key}"
    with _lock:
        if not os.access(out, os.X_OK):
            out.parent.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "GOFLAGS": "-mod=readonly -trimpath", "GOSUMDB": "off", "CGO_ENABLED": "0",
                   "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "local")}
            tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")  # renamed when whole: other processes may run it
            done = subprocess.run(["go", "build", "-o", str(tmp), "./policycheck"], cwd=ROOT / "e2e", env=env,
                                  capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"building e2e/policycheck failed: {done.stderr.strip()[-2000:]}")
            os.replace(tmp, out)
    return out


def check_policy(path: Path, structure_only: bool = False) -> None:
    """Raise ``PolicyRejected`` (with the decoder's words) unless the descheduler reads every key of ``path``.
    ``structure_only``: the policy's own keys only, for plugins that the pinned descheduler does not have (a
    build with out-of-tree plugins); their args are then not checked."""
    args = [str(checker()), *(["-structure-only"] if structure_only else []), str(path)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if done.returncode == 1:
        raise PolicyRejected(done.stderr.strip())
    if done.returncode != 0:
        raise RuntimeError(f"policycheck exited {done.returncode}: {done.stderr.strip()}")
