"""The descheduler configuration check, with the real ``kubernetes`` client against the fake API server over HTTP."""

from __future__ import annotations

import logging
import time

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from app.cluster.descheduler import DeschedulerCheck, background_evictions, config_labels
from app.domain.records import KubeVirtRecord
from tests.fakeapi import FakeApiServer

pytestmark = pytest.mark.timeout(60)
NS = "openshift-kube-descheduler-operator"
METRIC = "kubevirt_eviction_guard_descheduler_background_evictions"
INFO = "kubevirt_eviction_guard_descheduler_config_info"


def kubedescheduler(background: bool | None, name: str = "cluster", namespace: str = NS,
                    profiles: tuple[str, ...] = ("AffinityAndTaints",), **extra) -> dict:
    """A KubeDescheduler; by default with a profile that leaves background evictions to the flag."""
    spec: dict = {"managementState": "Managed", "profiles": list(profiles), **extra}
    if background is not None:
        spec["profileCustomizations"] = {"devEnableEvictionsInBackground": background}
    return {"apiVersion": "operator.openshift.io/v1", "kind": "KubeDescheduler",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def gauge(registry: CollectorRegistry) -> dict[str, float | None]:
    return {s: registry.get_sample_value(METRIC, {"state": s}) for s in ("enabled", "disabled", "unknown")}


def one_hot(state: str) -> dict[str, float]:
    return {s: (1.0 if s == state else 0.0) for s in ("enabled", "disabled", "unknown")}


def eventually(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


@pytest.fixture
def api():
    with FakeApiServer(bookmark_interval=0.2) as server:
        yield server


@pytest.fixture
def start(api):
    started: list[DeschedulerCheck] = []
    clients: list[client.ApiClient] = []

    def _start(**kwargs) -> tuple[DeschedulerCheck, CollectorRegistry]:
        registry = CollectorRegistry()
        clients.append(client.ApiClient(api.configuration()))
        check = DeschedulerCheck(clients[-1], registry, namespace=NS, watch_timeout=2,
                                 **{"rediscover_every": 0.1, "max_backoff": 0.2, **kwargs})
        started.append(check.start())
        return check, registry

    yield _start
    for check in started:
        check.stop(timeout=1)
    for c in clients:
        c.close()


def discovery_calls(api: FakeApiServer) -> int:
    return sum(1 for r in list(api.requests) if r.path == "/apis/operator.openshift.io/v1")


def info(registry: CollectorRegistry) -> list[dict[str, str]]:
    return [s.labels for f in registry.collect() for s in f.samples if s.name == INFO and s.value == 1]


@pytest.mark.parametrize(("obj", "state"), [
    ({"spec": {"profiles": ["KubeVirtRelieveAndMigrate"]}}, "enabled"),  # the operator turns it on itself
    ({"spec": {"profiles": ["DevKubeVirtRelieveAndMigrate"]}}, "enabled"),  # deprecated spelling, same rule
    ({"spec": {"profiles": ["LifecycleAndUtilization"]}}, "disabled"),
    ({"spec": {"profiles": "KubeVirtRelieveAndMigrate"}}, "disabled"),  # not a list
    ({"spec": {"profileCustomizations": {"devEnableEvictionsInBackground": True}}}, "enabled"),
    ({"spec": {"profileCustomizations": {"devEnableEvictionsInBackground": False}}}, "disabled"),
    ({"spec": {"profileCustomizations": {"devEnableEvictionsInBackground": "true"}}}, "disabled"),  # not a bool
    ({"spec": {"profileCustomizations": {}}}, "disabled"),  # the gate is off unless asked for
    ({"spec": {}}, "disabled"),
    ({}, "disabled"),
    (None, "unknown"),
])
def test_state_of_an_object(obj, state):
    assert background_evictions(obj) == state


# The seven combinations of the issue, each through the real client against the fake API over HTTP.
COMBINATIONS = {
    "profile only": (kubedescheduler(None, profiles=("KubeVirtRelieveAndMigrate",)), "enabled", "profile"),
    "dev flag only": (kubedescheduler(True, profiles=("LifecycleAndUtilization",)), "enabled", "flag"),
    "both": (kubedescheduler(True, profiles=("KubeVirtRelieveAndMigrate",)), "enabled", "profile+flag"),
    "neither": (kubedescheduler(False, profiles=("LifecycleAndUtilization",)), "disabled", ""),
    "another profile": (kubedescheduler(None, profiles=("AffinityAndTaints", "TopologyAndDuplicates")), "disabled", ""),
    "object absent": (None, "unknown", None),
    "forbidden": (kubedescheduler(None, profiles=("KubeVirtRelieveAndMigrate",)), "unknown", None),
}


@pytest.mark.parametrize("case", list(COMBINATIONS))
def test_combinations_over_http(api, start, case, caplog):
    obj, state, by = COMBINATIONS[case]
    if obj is not None:
        api.put(obj)
    if case == "forbidden":
        api.forbid("kubedescheduler")
    with caplog.at_level(logging.INFO, logger="kubevirt_eviction_guard.descheduler"):
        check, registry = start()
        if state == "unknown":  # unknown is also the starting state: wait until the API has answered
            assert eventually(lambda: any(r.status in (403, 200) for r in api.requests_for("kubedescheduler")))
            time.sleep(0.2)
        assert eventually(lambda: check.state == state), (case, check.state)
    assert gauge(registry) == one_hot(state)
    if by is None:
        assert info(registry) == [], "no configuration series while the object is unknown"
    else:
        (labels,) = info(registry)
        assert labels["background_evictions_by"] == by
        assert labels["profiles"] == ",".join(obj["spec"]["profiles"])
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if state == "disabled":
        assert warnings and "KubeVirtRelieveAndMigrate" in warnings[0] and "devEnableEvictionsInBackground: true" in warnings[0]
    else:
        assert not warnings
    if case == "forbidden":
        assert any(r.status == 403 for r in api.requests_for("kubedescheduler"))


def test_config_labels_of_the_kubevirt_profile():
    obj = kubedescheduler(None, profiles=("KubeVirtRelieveAndMigrate",), deschedulingIntervalSeconds=60,
                          mode="Automatic")
    obj["spec"]["profileCustomizations"] = {"devMigrationCooldown": "30m"}
    assert config_labels(obj) == {
        "profiles": "KubeVirtRelieveAndMigrate", "mode": "Automatic", "interval_seconds": "60",
        "eviction_limit_total": "5", "eviction_limit_node": "2",  # the operator's defaults for this profile
        "migration_aware_plugin": "true", "background_evictions_by": "profile",
        "migration_cooldown": "30m", "max_migration_cooldown": "", "migration_history_window": "",
        "kubevirt_parallel_outbound_per_node": "", "node_limit_above_kubevirt": "unknown",  # no KubeVirt CR known
    }
    obj["spec"]["evictionLimits"] = {"total": 10, "node": 3}
    assert (config_labels(obj)["eviction_limit_total"], config_labels(obj)["eviction_limit_node"]) == ("10", "3")


def test_node_limit_against_kubevirt_parallel_outbound_migrations():
    """OpenShift Virtualization installs parallelOutboundMigrationsPerNode 1 while the profile lets 2 VMs leave a node."""
    obj = kubedescheduler(None, profiles=("KubeVirtRelieveAndMigrate",))
    hco = KubeVirtRecord("openshift-cnv", "kubevirt-kubevirt-hyperconverged", parallel_outbound_per_node=1)
    labels = config_labels(obj, hco)
    assert (labels["eviction_limit_node"], labels["kubevirt_parallel_outbound_per_node"],
            labels["node_limit_above_kubevirt"]) == ("2", "1", "true")
    upstream = KubeVirtRecord("kubevirt", "kubevirt")  # unset: KubeVirt's default 2
    assert config_labels(obj, upstream)["node_limit_above_kubevirt"] == "false"
    obj["spec"]["evictionLimits"] = {"node": 1}  # replaces LowNodeUtilization's evictionLimits.node as well
    assert config_labels(obj, hco)["node_limit_above_kubevirt"] == "false"
    assert config_labels(kubedescheduler(True, profiles=("LifecycleAndUtilization",)), hco)[
        "node_limit_above_kubevirt"] == "true"  # no per-node limit at all


def test_config_labels_of_another_profile():
    labels = config_labels(kubedescheduler(True, profiles=("LifecycleAndUtilization",)))
    assert labels["mode"] == "Predictive"  # the CRD's default
    assert labels["interval_seconds"] == ""
    assert (labels["eviction_limit_total"], labels["eviction_limit_node"]) == ("", "")  # no limit
    assert labels["migration_aware_plugin"] == "false" and labels["background_evictions_by"] == "flag"
    odd = config_labels({"spec": {"profiles": [1, "X"], "evictionLimits": {"node": "2"}, "deschedulingIntervalSeconds": True}})
    assert odd["profiles"] == "X" and odd["eviction_limit_node"] == "" and odd["interval_seconds"] == ""


def test_config_series_follows_the_object(api, start):
    api.put(kubedescheduler(None, profiles=("KubeVirtRelieveAndMigrate",), deschedulingIntervalSeconds=3600))
    check, registry = start()
    assert eventually(lambda: [lab.get("interval_seconds") for lab in info(registry)] == ["3600"])
    api.put(kubedescheduler(None, profiles=("KubeVirtRelieveAndMigrate",), deschedulingIntervalSeconds=60))
    assert eventually(lambda: [lab.get("interval_seconds") for lab in info(registry)] == ["60"]), "one series, replaced"
    api.delete("kubedescheduler", NS, "cluster")
    assert eventually(lambda: info(registry) == [])
    assert check.state == "unknown"


def test_absent_api_is_unknown_and_quiet(api, start, caplog):
    api.remove_api("operator.openshift.io")
    with caplog.at_level(logging.INFO, logger="kubevirt_eviction_guard.descheduler"):
        check, registry = start()
        assert eventually(lambda: discovery_calls(api) >= 3), "discovery is retried quietly"
    assert gauge(registry) == one_hot("unknown")
    records = [r for r in caplog.records if r.name == "kubevirt_eviction_guard.descheduler"]
    assert [r.levelname for r in records] == ["INFO"], [r.getMessage() for r in records]
    assert "does not serve kubedeschedulers" in records[0].getMessage()
    assert not api.requests_for("kubedescheduler"), "no list or watch of an API that is not there"


def test_follows_the_cluster_object_through_its_life(api, start):
    api.put(kubedescheduler(True, name="other"))  # another object in the namespace: not ours
    check, registry = start()
    assert eventually(lambda: api.watch_count("kubedescheduler") == 1)
    assert gauge(registry) == one_hot("unknown"), "no cluster object yet"

    api.put(kubedescheduler(False))
    assert eventually(lambda: check.state == "disabled")
    assert gauge(registry) == one_hot("disabled")

    api.put(kubedescheduler(True))
    assert eventually(lambda: check.state == "enabled")
    assert gauge(registry) == one_hot("enabled")

    api.put(kubedescheduler(False, name="other"))
    time.sleep(0.3)
    assert check.state == "enabled", "a change to another object does not count"

    api.delete("kubedescheduler", NS, "cluster")
    assert eventually(lambda: check.state == "unknown")
    assert gauge(registry) == one_hot("unknown")
    watches = api.requests_for("kubedescheduler", watch=True)
    assert all(r.query.get("fieldSelector") == "metadata.name=cluster" for r in watches)


def test_existing_object_is_read_at_start(api, start):
    api.put(kubedescheduler(True))
    check, registry = start()
    assert eventually(lambda: check.state == "enabled")
    assert gauge(registry) == one_hot("enabled")


def test_survives_compaction_cut_streams_and_an_outage(api, start):
    api.put(kubedescheduler(False))
    check, registry = start()
    assert eventually(lambda: check.state == "disabled" and api.watch_count("kubedescheduler") == 1)
    lists_before = len(api.requests_for("kubedescheduler", watch=False))

    api.compact(expire_watches=True)  # 410 on the open watch: relist
    assert eventually(lambda: len(api.requests_for("kubedescheduler", watch=False)) > lists_before)
    api.put(kubedescheduler(True))
    assert eventually(lambda: check.state == "enabled")

    api.cut_streams("kubedescheduler")  # dropped mid-stream: watch again
    assert eventually(lambda: api.watch_count("kubedescheduler") == 1)
    api.put(kubedescheduler(False))
    assert eventually(lambda: check.state == "disabled")

    api.down()
    time.sleep(0.5)
    assert check.state == "disabled", "an unreachable API server does not change the cluster's setting"
    api.up()
    assert eventually(lambda: api.watch_count("kubedescheduler") == 1)
    api.put(kubedescheduler(True))
    assert eventually(lambda: check.state == "enabled")


def test_forbidden_is_unknown_and_quiet(api, start, caplog):
    api.put(kubedescheduler(True))
    api.forbid("kubedescheduler")
    with caplog.at_level(logging.INFO, logger="kubevirt_eviction_guard.descheduler"):
        check, registry = start()
        assert eventually(lambda: len(api.requests_for("kubedescheduler")) >= 3)
    assert gauge(registry) == one_hot("unknown")
    records = [r for r in caplog.records if r.name == "kubevirt_eviction_guard.descheduler"]
    assert [r.levelname for r in records] == ["INFO"] and "403" in records[0].getMessage()


def test_api_installed_later_is_picked_up(api, start):
    api.remove_api("operator.openshift.io")
    api.put(kubedescheduler(True))
    check, registry = start()
    assert eventually(lambda: discovery_calls(api) >= 2)
    assert check.state == "unknown"
    api.restore_api("operator.openshift.io")
    assert eventually(lambda: check.state == "enabled")
    assert gauge(registry) == one_hot("enabled")


def test_serve_in_live_mode_exports_the_check_on_the_metrics_port(api, tmp_path):
    """The real `serve` process, watching the fake API server through a kubeconfig, as the chart runs it."""
    import os
    import socket
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path

    from prometheus_client.parser import text_string_to_metric_families

    from app.transport.tls import issue_certs, write_certs

    root = Path(__file__).resolve().parents[1]
    certs = write_certs(issue_certs("guard", "ns"), tmp_path / "certs")
    api.put(kubedescheduler(False))
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBECONFIG")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "serve", "--log-format", "json", "--host", "127.0.0.1", "--port", str(ports[0]),
         "--metrics-port", str(ports[1]), "--tls-cert", str(certs["cert"]), "--tls-key", str(certs["key"]),
         "--kubeconfig", str(kubeconfig), "--descheduler-namespace", NS],
        cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "guard.log").open("wb"),
    )

    def state() -> dict[str, float]:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{ports[1]}/metrics", timeout=2).read().decode()
        except OSError:
            return {}
        return {s.labels["state"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == METRIC}

    try:
        assert eventually(lambda: state() == one_hot("disabled"), timeout=20), (tmp_path / "guard.log").read_text()[-2000:]
        api.put(kubedescheduler(True))
        assert eventually(lambda: state() == one_hot("enabled"), timeout=20)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
