"""What the outcome run's actor serves for the guard's steering (tests/e2e/actor/load.py): virt-handler's per-VMI
metrics and kube-state-metrics' node capacity under KubeVirt v1.8.3's and kube-state-metrics' names, labels and units;
and the outcome run's seeds (tests/e2e/outcome/__main__.py)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.metricsource.prometheus import node_of
from tests.e2e.actor.load import GIB, ClusterExporters
from tests.e2e.outcome.__main__ import combine, parse_seeds
from tests.e2e.outcome.figures import KEYS


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def scrape(exporters: ClusterExporters) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry()
    registry.register(exporters)
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def vmi(name: str, node: str) -> tuple:
    return tuple(sorted({"node": node, "namespace": "vms", "name": name,
                         "kubernetes_vmi_label_kubevirt_io_nodeName": node}.items()))


def test_a_vms_cpu_counter_grows_at_its_use_and_starts_again_on_its_new_node():
    clock, where = Clock(), {("vms", "a"): "w0"}
    ex = ClusterExporters("vms", {"w0": (64.0, 512 * GIB)}, lambda: dict(where), clock)
    ex.update({"a": (2.0, 16 * GIB, 4 * GIB)})
    clock.t += 10
    got = scrape(ex)
    assert got[("kubevirt_vmi_cpu_usage_seconds_total", vmi("a", "w0"))] == pytest.approx(20.0), got
    ex.update({"a": (0.5, 16 * GIB, 4 * GIB)})  # from here on, half a core
    clock.t += 4
    got = scrape(ex)
    assert got[("kubevirt_vmi_cpu_usage_seconds_total", vmi("a", "w0"))] == pytest.approx(22.0), got
    where[("vms", "a")] = "w1"  # migrated: the target's domain counts from 0
    got = scrape(ex)
    assert ("kubevirt_vmi_cpu_usage_seconds_total", vmi("a", "w0")) not in got, got
    clock.t += 2
    got = scrape(ex)
    assert got[("kubevirt_vmi_cpu_usage_seconds_total", vmi("a", "w1"))] == pytest.approx(1.0), got


def test_memory_is_served_as_virt_handler_serves_it_and_used_is_left_to_kubevirts_rule():
    clock = Clock()
    ex = ClusterExporters("vms", {}, lambda: {("vms", "a"): "w0"}, clock)
    ex.update({"a": (1.0, 16 * GIB, 6 * GIB)})
    got = scrape(ex)
    available = got[("kubevirt_vmi_memory_available_bytes", vmi("a", "w0"))]
    usable = got[("kubevirt_vmi_memory_usable_bytes", vmi("a", "w0"))]
    assert available == 16 * GIB and available - usable == pytest.approx(6 * GIB), got
    assert not any(name == "kubevirt_vmi_memory_used_bytes" for name, _ in got), got


def test_node_capacity_has_kube_state_metrics_labels_and_units_and_names_the_node_for_the_guard():
    ex = ClusterExporters("vms", {"w0": (64.0, 512 * GIB)}, dict)
    got = scrape(ex)
    cpu = (("node", "w0"), ("resource", "cpu"), ("unit", "core"))
    memory = (("node", "w0"), ("resource", "memory"), ("unit", "byte"))
    assert got[("kube_node_status_capacity", cpu)] == 64.0, got
    assert got[("kube_node_status_capacity", memory)] == 512 * GIB, got
    assert node_of(dict(cpu)) == "w0"


def test_a_vmi_running_nowhere_is_not_served():
    ex = ClusterExporters("vms", {}, lambda: {("vms", "a"): ""}, Clock())
    ex.update({"a": (1.0, GIB, GIB / 2)})
    got = scrape(ex)
    assert not any(name.startswith("kubevirt_vmi_") for name, _ in got), got


@pytest.mark.parametrize("text,seeds", [("1-3", [1, 2, 3]), ("2", [2]), ("1,4", [1, 4]), ("1-2,2-3", [1, 2, 3])])
def test_seeds_are_read_as_ranges_and_lists(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "a", "3-1", "1-", "-2", "1,,2"])
def test_a_bad_seed_list_is_refused(text):
    with pytest.raises(ValueError):
        parse_seeds(text)


def seed_result(real: float, model_mean: float, model_range: tuple[float, float]) -> dict:
    figures = dict.fromkeys(KEYS, real)
    model = {**dict.fromkeys(KEYS, model_mean), "range": dict.fromkeys(KEYS, list(model_range)), "draws": 30}
    return {"form": "full", "scenario": "e2e-outcome", "duration_s": 720, "interval_s": 10,
            "modes": {"descheduler": figures}, "model_modes": {"descheduler": "upstream"},
            "model": {"descheduler": model}, "balance_from_s": 10, "differences": {"descheduler": {}}}


def test_seeds_combine_into_the_real_rolls_range_beside_the_models():
    got = combine({1: seed_result(4, 5, (2, 9)), 2: seed_result(10, 7, (3, 12)), 3: seed_result(7, 6, (1, 8))})
    real, model = got["real"]["descheduler"], got["model"]["descheduler"]
    assert (real["migrations"], real["range"]["migrations"], real["rolls"]) == (7, [4, 10], 3), real
    assert (model["migrations"], model["range"]["migrations"], model["draws"]) == (6, [1, 12], 90), model
    assert got["seeds"] == [1, 2, 3], got
