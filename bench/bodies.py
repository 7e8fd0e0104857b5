"""AdmissionReview eviction bodies, as the API server sends them, aimed at the synthetic cluster.

Each body is one of the recorded fixtures (``tests/fixtures/admission``: plain kubectl evictions, the
descheduler's, dry runs, v1beta1, mutating and validating copies) with the pod, namespace and uid rewritten.
Which pods are evicted, by which requests, and how many distinct bodies there are is the mix's
(``bench.mixes``); which decisions they produced is read back from the guard's own metrics.
"""

from __future__ import annotations

import copy
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.mixes import MIXES, SIZE, Mix
from bench.state import Targets

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "admission"


@dataclass(frozen=True)
class Body:
    path: str  # /mutate or /validate, as the fixture was recorded
    body: bytes


def load_fixtures(stems) -> dict[str, dict]:
    if not FIXTURES.is_dir():
        raise FileNotFoundError(f"{FIXTURES}: the recorded AdmissionReviews (tests/fixtures/admission) are missing")
    return {stem: orjson.loads((FIXTURES / f"{stem}.json").read_bytes()) for stem in stems}


def _aim(review: dict, namespace: str, pod: str, uid: str) -> dict:
    doc = copy.deepcopy(review)
    req = doc["request"]
    req.update(uid=uid, namespace=namespace, name=pod)
    meta = (req.get("object") or {}).get("metadata")
    if isinstance(meta, dict):
        meta.update(name=pod, namespace=namespace)
    return doc


def build_bodies(targets: Targets, count: int | None = None, seed: int = 6, mix: Mix = MIXES["fixtures"]) -> list[Body]:
    """``count`` bodies (the mix's own number when None) of ``mix`` aimed at ``targets``."""
    rng = random.Random(seed)
    fixtures = load_fixtures(mix.requests)
    groups = [g for g in mix.pods if targets.groups.get(g)]
    weights = [len(targets.groups[g]) if mix.pods[g] == SIZE else float(mix.pods[g]) for g in groups]
    stems = list(mix.requests)
    stem_weights = [mix.requests[s] for s in stems]
    out = []
    for _ in range(mix.bodies if count is None else count):
        group = rng.choices(groups, weights)[0]
        namespace, pod = rng.choice(targets.groups[group])
        stem = rng.choices(stems, stem_weights)[0]
        doc = _aim(fixtures[stem], namespace, pod, str(uuid.UUID(int=rng.getrandbits(128), version=4)))
        if mix.not_an_eviction and rng.random() < mix.not_an_eviction:
            doc["request"].update(operation="DELETE", subResource="")
        path = "/mutate" if ".mutating" in stem else "/validate"
        out.append(Body(path=path, body=orjson.dumps(doc)))
    return out


def write_bodies(bodies: list[Body], path: Path) -> None:
    """One request per line, ``PATH<TAB>JSON``: read by the Python load generator and by wrk's Lua script."""
    with path.open("wb") as f:
        for b in bodies:
            f.write(b.path.encode() + b"\t" + b.body + b"\n")


def read_bodies(path: Path) -> list[Body]:
    out = []
    for line in path.read_bytes().splitlines():
        if line:
            p, _, body = line.partition(b"\t")
            out.append(Body(path=p.decode(), body=body))
    return out
