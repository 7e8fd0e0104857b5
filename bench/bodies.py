"""AdmissionReview eviction bodies, as the API server sends them, aimed at the synthetic cluster.

Each body is one of the recorded fixtures (``tests/fixtures/admission``: plain
kubectl evictions, the descheduler's, dry runs, v1beta1, mutating and
validating copies) with the pod, namespace and uid rewritten. Which pods are
evicted is weighted so that the mix crosses the whole decision table; which
decisions it produced is read back from the guard's own metrics.
"""

from __future__ import annotations

import copy
import random
import uuid
from dataclasses import dataclass
from pathlib import Path

import orjson

from bench.state import Targets

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "admission"

# which pods are evicted: group in bench.state.Targets -> weight
POD_MIX = {
    "never_migrated": 24,  # quiet node: allowed
    "recently_migrated": 24,  # quiet node: cooldown or allowed
    "busy_node": 12,  # node budget (descheduler) or allowed (others)
    "in_flight_source": 10,  # rule 6
    "migration_target": 5,  # rule 5
    "evacuation_pending": 5,  # rule 7
    "cordoned_node": 5,  # drain: allowed
    "not_a_launcher": 8,  # rule 3
    "vmi_gone": 3,  # rule 4
    "unknown_pod": 3,  # rule 3
}
# who evicts, as the recorded requests: fixture stem -> weight
REQUEST_MIX = {
    "eviction-requested-by-descheduler.validating": 30,
    "eviction-requested-by-descheduler.mutating": 15,
    "eviction-from-descheduler-PodEvictor-a-evacuate-fake.validating": 8,
    "eviction-from-descheduler-PodEvictor-c-allow-fake.validating": 7,
    "eviction-plain.validating": 12,
    "eviction-plain.mutating": 6,
    "eviction-plain.validating.admissionreview-v1beta1": 3,
    "eviction-grace-and-user.validating": 5,
    "eviction-grace-and-user.mutating": 3,
    "eviction-dryrun-query.validating": 3,
    "eviction-deleteoptions-dryrun.validating": 2,
    "eviction-dryrun-query.mutating": 1,
    "eviction-deleteoptions-dryrun.mutating": 1,
}
NOT_AN_EVICTION_SHARE = 0.01  # a DELETE of a pod routed here by a too-wide registration


@dataclass(frozen=True)
class Body:
    path: str  # /mutate or /validate, as the fixture was recorded
    body: bytes


def load_fixtures() -> dict[str, dict]:
    if not FIXTURES.is_dir():
        raise FileNotFoundError(f"{FIXTURES}: the recorded AdmissionReviews (tests/fixtures/admission) are missing")
    out = {}
    for stem in REQUEST_MIX:
        f = FIXTURES / f"{stem}.json"
        out[stem] = orjson.loads(f.read_bytes())
    return out


def _aim(review: dict, namespace: str, pod: str, uid: str) -> dict:
    doc = copy.deepcopy(review)
    req = doc["request"]
    req.update(uid=uid, namespace=namespace, name=pod)
    meta = (req.get("object") or {}).get("metadata")
    if isinstance(meta, dict):
        meta.update(name=pod, namespace=namespace)
    return doc


def build_bodies(targets: Targets, count: int, seed: int = 6) -> list[Body]:
    rng = random.Random(seed)
    fixtures = load_fixtures()
    groups = [g for g in POD_MIX if targets.groups.get(g)]
    weights = [POD_MIX[g] for g in groups]
    stems = list(REQUEST_MIX)
    stem_weights = [REQUEST_MIX[s] for s in stems]
    out = []
    for _ in range(count):
        group = rng.choices(groups, weights)[0]
        namespace, pod = rng.choice(targets.groups[group])
        stem = rng.choices(stems, stem_weights)[0]
        doc = _aim(fixtures[stem], namespace, pod, str(uuid.UUID(int=rng.getrandbits(128), version=4)))
        if rng.random() < NOT_AN_EVICTION_SHARE:
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
