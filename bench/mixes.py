"""The request mixes ``make bench`` sends: what clusters send, each named.

A mix describes requests and the cluster they are aimed at, nothing of the server that answers them: which pods
of the synthetic cluster (``bench.state``'s target groups) are evicted, by which recorded requests
(``tests/fixtures/admission``), and how many distinct requests the stream cycles through. What each mix made the
guard decide is read back from the guard's own metrics and printed beside its numbers.

- ``fixtures``: every recorded request (descheduler, kubectl, dry runs, v1beta1, mutating and validating) at pods
  weighted to cross the whole decision table; 4,000 requests cycled.
- ``descheduler``: a descheduler's evictions (its recorded request, at the chart's default mutating webhook) of
  launcher pods drawn uniformly at random from the VMs on nodes with nothing leaving, the bulk of a large cluster:
  mostly quiet VMs, so mostly allowed, the recently migrated ones refused for their cooldown. 40,000 distinct
  requests: an allowed VM moves away, so a descheduler seldom evicts the same pod twice within a minute, and each
  allowed eviction is a VM the guard has not answered for lately (it starts a look-out for the migration, the
  confirmation of ``EvictionAllowed``); each cooldown refusal counts towards an ``EvictionBlocked`` Event.
- ``outcome``: the real descheduler's evictions in ``make e2e-outcome``'s ``descheduler+guard`` mode, 428 sent of
  which 410 refused (400 ``node_busy``, 8 ``cooldown``, 2 a migration target) and 18 allowed: VMs on nodes with
  one VM already leaving (as the node budget keeps a guarded cluster's nodes), a few recently migrated VMs on quiet
  nodes (about half of them inside their cooldown), a few never migrated, a few migration targets. Refused evictions are retried by the descheduler at its next cycles, so
  the stream cycles through 2,000 requests.
"""

from __future__ import annotations

from dataclasses import dataclass

SIZE = "size"  # a pod group's weight: its number of pods (pods drawn uniformly from the groups named)


@dataclass(frozen=True)
class Mix:
    name: str
    about: str
    pods: dict[str, float | str]  # bench.state.Targets group -> weight, or SIZE
    requests: dict[str, float]  # fixture stem in tests/fixtures/admission -> weight
    bodies: int  # distinct requests the stream cycles through
    not_an_eviction: float = 0.0  # share of DELETEs of a pod routed here by a too-wide registration
    expected_denied: float | None = None  # the share of refusals the mix stands for (checked after the run)


DESCHEDULER = "eviction-requested-by-descheduler.mutating"

MIXES: dict[str, Mix] = {m.name: m for m in (
    Mix(
        name="fixtures",
        about="every recorded request, at pods weighted across the decision table",
        pods={
            "never_migrated": 24,  # quiet node: allowed
            "recently_migrated": 24,  # quiet node: cooldown or allowed
            "busy_node": 12,  # node budget (descheduler) or allowed (others)
            "in_flight_source": 10,
            "migration_target": 5,
            "evacuation_pending": 5,
            "cordoned_node": 5,  # drain: allowed
            "not_a_launcher": 8,
            "vmi_gone": 3,
            "unknown_pod": 3,
        },
        requests={
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
        },
        bodies=4000,
        not_an_eviction=0.01,
    ),
    Mix(
        name="descheduler",
        about="a descheduler's evictions of VMs drawn at random from the nodes with nothing leaving (mostly allowed)",
        pods={"never_migrated": SIZE, "recently_migrated": SIZE, "cordoned_node": SIZE},
        requests={DESCHEDULER: 1},
        bodies=40_000,
    ),
    Mix(
        name="outcome",
        about="the real descheduler's evictions in make e2e-outcome's descheduler+guard mode (410 of 428 refused)",
        pods={"one_leaving_node": 400, "recently_migrated": 16, "never_migrated": 10, "migration_target": 2},
        requests={DESCHEDULER: 1},
        bodies=2000,
        expected_denied=410 / 428,
    ),
)}
DEFAULT = ("fixtures", "descheduler", "outcome")
