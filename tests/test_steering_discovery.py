"""Steering on by default where the descheduler's Prometheus is: found from the descheduler's own policy
(a ConfigMap, served by the fake API server), polled from a real Prometheus (tests/prometheus_support.py);
and, without one, decisions exactly as without steering, with the reason said in the log, the metric and
``report``."""

from __future__ import annotations

import base64
import json

import pytest
from kubernetes import client

from app.cli import main as cli_main
from app.metricsource.discovery import PolicyProblem, SecretToken, discover, provider_from_policy
from tests.builders import node, pod, vmi
from tests.fakeapi import FakeApiServer
from tests.guard_process import GuardProcess, free_port
from tests.live_support import eventually, evict, reason, scrape
from tests.prometheus_support import start_prometheus

OBJECTS = [node("worker-a"), node("worker-b"), node("worker-c", cordoned=True),
           *(o for name in ("db", "web", "big") for o in (vmi(name, "worker-a"), pod(name, "worker-a"))),
           vmi("calm", "worker-b"), pod("calm", "worker-b")]
STATE = "kubevirt_eviction_guard_steering_state"


def policy(url: str | None, secret: dict | None = None) -> str:
    """A descheduler v1alpha2 policy, as the upstream chart and OpenShift's operator write it."""
    doc: dict = {"apiVersion": "descheduler/v1alpha2", "kind": "DeschedulerPolicy",
                 "profiles": [{"name": "p", "pluginConfig": [], "plugins": {"balance": {"enabled": ["LowNodeUtilization"]}}}]}
    if url is not None:
        prom: dict = {"url": url}
        if secret is not None:
            prom["authToken"] = {"secretReference": secret}
        doc["metricsProviders"] = [{"source": "KubernetesMetrics"}, {"source": "Prometheus", "prometheus": prom}]
    return json.dumps(doc)


def configmap(namespace: str, name: str, text: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": namespace, "name": name},
            "data": {"policy.yaml": text}}


def log_line(g: GuardProcess, msg: str) -> dict:
    """The first log line with this message (log writes are batched: wait for it)."""
    def find():
        return next((json.loads(x) for x in g.log.read_text().splitlines() if f'"msg":"{msg}"' in x), None)
    return eventually(find, timeout=10, what=f"log line {msg!r}")


def states(samples: dict) -> dict[str, float]:
    return {dict(labels)["state"]: v for (name, labels), v in samples.items() if name == STATE}


# -- the policy, read as the descheduler reads it ---------------------------------------------------------------


def test_a_policy_names_its_prometheus_and_the_secret_with_its_token() -> None:
    p = provider_from_policy(policy("https://prom.example:9091/", {"namespace": "ds", "name": "tok"}), "here")
    assert (p.url, p.token_secret, p.where) == ("https://prom.example:9091", ("ds", "tok"), "here")
    plain = provider_from_policy(policy("http://prom:9090"), "here")
    assert (plain.url, plain.token_secret) == ("http://prom:9090", None)  # the descheduler's own token


def test_a_policy_without_a_prometheus_provider_names_none() -> None:
    assert provider_from_policy(policy(None), "here") is None
    assert provider_from_policy("kind: DeschedulerPolicy\nmetricsProviders:\n- source: KubernetesMetrics\n", "x") is None


@pytest.mark.parametrize("text, expected", [
    ("{", "not YAML"),
    ("kind: ConfigMap", "not a DeschedulerPolicy"),
    ("kind: DeschedulerPolicy\nmetricsProviders: {}", "not a list"),
    ("kind: DeschedulerPolicy\nmetricsProviders:\n- source: Prometheus\n", "no http(s) url"),
    ("kind: DeschedulerPolicy\nmetricsProviders:\n- source: Prometheus\n  prometheus: {url: 'ftp://x'}\n", "no http(s) url"),
    (policy("https://p", {"name": "only-a-name"}), "both namespace and name"),
])
def test_a_malformed_policy_says_what_is_wrong(text, expected) -> None:
    with pytest.raises(PolicyProblem) as e:
        provider_from_policy(text, "ConfigMap a/b")
    assert expected in str(e.value) and "ConfigMap a/b" in str(e.value), str(e.value)


# -- discovery against an API server -----------------------------------------------------------------------------


@pytest.fixture
def api():
    with FakeApiServer() as server:
        yield server


def _client(api: FakeApiServer) -> client.ApiClient:
    return client.ApiClient(api.configuration())


def test_discovery_takes_the_first_policy_that_names_a_prometheus(api) -> None:
    api.put(configmap("openshift-kube-descheduler-operator", "cluster", policy(None)))
    api.put(configmap("kube-system", "descheduler", policy("https://prom:9091")))
    with _client(api) as c:
        found = discover(c, ["nowhere/absent", "openshift-kube-descheduler-operator/cluster", "kube-system/descheduler"])
        assert found.provider is not None, found.why
        assert (found.provider.url, found.provider.where) == ("https://prom:9091", "ConfigMap kube-system/descheduler")
        none = discover(c, ["nowhere/absent", "openshift-kube-descheduler-operator/cluster"])
    assert none.provider is None
    assert "no ConfigMap nowhere/absent" in none.why and "names no Prometheus" in none.why, none.why


def test_discovery_says_when_it_may_not_read_the_policy(api) -> None:
    api.put(configmap("kube-system", "descheduler", policy("https://prom:9091")))
    api.forbid("configmaps", ("get",))
    with _client(api) as c:
        found = discover(c, ["kube-system/descheduler"])
    assert found.provider is None and "may not read ConfigMap kube-system/descheduler (403" in found.why, found.why


def test_the_token_comes_from_the_secret_the_policy_names(api) -> None:
    api.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"namespace": "ds", "name": "tok"},
             "data": {"prometheusAuthToken": base64.b64encode(b"s3cret\n").decode()}})
    api.put({"apiVersion": "v1", "kind": "Secret", "metadata": {"namespace": "ds", "name": "empty"}, "data": {}})
    with _client(api) as c:
        assert SecretToken(c, "ds", "tok")() == "s3cret"
        with pytest.raises(OSError) as e:
            SecretToken(c, "ds", "empty")()
        assert "Secret ds/empty has no prometheusAuthToken" in str(e.value)
        with pytest.raises(OSError) as e:
            SecretToken(c, "ds", "gone")()
        assert "no Secret ds/gone" in str(e.value)


# -- the guard, live, as installed ------------------------------------------------------------------------------


def live_guard(api: FakeApiServer, tmp_path, *extra: str) -> GuardProcess:
    api.load(OBJECTS)
    kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
    g = GuardProcess(tmp_path, ["--kubeconfig", str(kubeconfig), "--shutdown-drain", "0s", "--no-side-effects",
                                "--no-descheduler-check", "--prometheus-interval", "1s", "--prometheus-max-age", "10m",
                                *extra])
    g.wait_healthy()
    return g


def ready_state(http, want: str) -> dict[str, float]:
    eventually(lambda: http.get("/readyz").status_code == 200, timeout=20, what="readiness")
    return eventually(lambda: (s := states(scrape(http))) and s.get(want) == 1.0 and s, timeout=20,
                      what=f"steering_state {want}")


@pytest.mark.prometheus
def test_the_guard_steers_with_the_prometheus_its_descheduler_policy_names(api, tmp_path) -> None:
    prometheus = start_prometheus(tmp_path / "prometheus")
    try:
        api.put(configmap("kube-system", "descheduler", policy(prometheus.url)))
        g = live_guard(api, tmp_path)
        try:
            with g.client() as http:
                s = ready_state(http, "on")
                assert sum(s.values()) == 1.0, s  # exactly one state
                r = evict(http, "virt-launcher-db-abcde")
                assert (r["allowed"], reason(r)) == (False, "better_candidate"), r["status"]
            line = log_line(g, "steering on")
            assert line["url"] == prometheus.url and line["from"] == "ConfigMap kube-system/descheduler", line
        finally:
            g.stop()
    finally:
        prometheus.stop()


def test_without_a_policy_the_guard_decides_as_without_steering_and_says_why(api, tmp_path) -> None:
    g = live_guard(api, tmp_path)
    try:
        with g.client() as http:
            s = ready_state(http, "not_found")
            assert sum(s.values()) == 1.0, s
            r = evict(http, "virt-launcher-db-abcde")
            assert (r["allowed"], reason(r)) == (True, "allowed"), r  # no steering refusal, no metrics_unavailable
        line = log_line(g, "steering off")
        assert line["state"] == "not_found" and "no ConfigMap kube-system/descheduler" in line["why"], line
    finally:
        g.stop()


def test_an_unreachable_discovered_prometheus_leaves_decisions_as_without_steering(api, tmp_path) -> None:
    api.put(configmap("kube-system", "descheduler", policy(f"http://127.0.0.1:{free_port()}")))
    g = live_guard(api, tmp_path)
    try:
        with g.client() as http:
            ready_state(http, "unreachable")
            r = evict(http, "virt-launcher-db-abcde")
            assert (r["allowed"], reason(r)) == (True, "allowed"), r
        line = log_line(g, "steering off")
        assert line["state"] == "unreachable" and "cannot reach Prometheus" in line["why"], line
    finally:
        g.stop()


def test_steering_off_wins_over_a_policy_that_names_prometheus(api, tmp_path) -> None:
    api.put(configmap("kube-system", "descheduler", policy("http://127.0.0.1:9")))
    g = live_guard(api, tmp_path, "--steering", "off")
    try:
        with g.client() as http:
            ready_state(http, "disabled")
    finally:
        g.stop()


def test_steering_off_and_a_prometheus_url_contradict(capsys) -> None:
    code = cli_main(["report", "--snapshot", "examples/demo-snapshot.yaml", "--steering", "off",
                     "--prometheus-url", "http://127.0.0.1:9"])
    assert code == 2 and "--steering off: contradicts --prometheus-url" in capsys.readouterr().err


@pytest.mark.parametrize("args, state, why", [
    ([], "not_configured", "no --prometheus-url, and a snapshot names no descheduler policy"),
    (["--steering", "off"], "disabled", "--steering off"),
])
def test_report_says_whether_steering_is_on_and_why_not(capsys, args, state, why) -> None:
    assert cli_main(["report", "--snapshot", "examples/demo-snapshot.yaml", "-o", "json", *args]) == 0
    st = json.loads(capsys.readouterr().out)["cluster"]["steering"]
    assert (st["state"], st["why"]) == (state, why), st
    assert cli_main(["report", "--snapshot", "examples/demo-snapshot.yaml", *args]) == 0
    assert f"steering: off: {state.replace('_', ' ')}: {why}" in capsys.readouterr().out


def test_report_names_an_unreachable_prometheus(capsys) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert cli_main(["report", "--snapshot", "examples/demo-snapshot.yaml", "-o", "json", "--prometheus-url", url,
                     "--prometheus-timeout", "2s"]) == 0
    st = json.loads(capsys.readouterr().out)["cluster"]["steering"]
    assert (st["state"], st["url"], st["from"]) == ("unreachable", url, "--prometheus-url"), st
    assert "cannot reach Prometheus" in st["why"], st


def test_a_bad_descheduler_policy_flag_stops_start_up(capsys) -> None:
    code = cli_main(["report", "--snapshot", "examples/demo-snapshot.yaml", "--descheduler-policy", "no-slash"])
    assert code == 2 and "--descheduler-policy: expected NAMESPACE/NAME, got 'no-slash'" in capsys.readouterr().err


@pytest.mark.prometheus
def test_a_steering_refusal_writes_no_event_where_other_denials_do(api, tmp_path) -> None:
    prometheus = start_prometheus(tmp_path / "prometheus")
    try:
        api.put(configmap("kube-system", "descheduler", policy(prometheus.url)))
        api.load([vmi("leaving", "worker-b", evacuation="worker-b"), pod("leaving", "worker-b")])
        api.load(OBJECTS)
        g = GuardProcess(tmp_path, ["--kubeconfig", str(api.write_kubeconfig(tmp_path / "kubeconfig")),
                                    "--shutdown-drain", "0s", "--no-descheduler-check", "--event-interval", "0s",
                                    "--prometheus-interval", "1s", "--prometheus-max-age", "10m"])
        try:
            g.wait_healthy()
            with g.client() as http:
                ready_state(http, "on")
                for _ in range(3):
                    r = evict(http, "virt-launcher-db-abcde")
                    assert reason(r) == "better_candidate", r["status"]
                assert reason(evict(http, "virt-launcher-leaving-abcde")) == "evacuation_pending"
            events = eventually(lambda: [e for e in api.events() if e.get("reason") == "EvictionBlocked"] or None,
                                timeout=10, what="the evacuation_pending Event")
            names = {e["involvedObject"]["name"] for e in events}
            assert names == {"leaving"}, events  # none for vms/db
        finally:
            g.stop()
    finally:
        prometheus.stop()


def test_rediscovery_follows_the_policy_and_keeps_its_prometheus_through_an_api_error(api) -> None:
    from app.metricsource.discovery import Discovery, Provider
    from app.metricsource.prometheus import PrometheusSource
    from app.metricsource.steering import Steering

    built: list[PrometheusSource] = []

    def build(p: Provider) -> PrometheusSource:
        built.append(PrometheusSource(p.url))
        return built[-1]

    st = Steering.found(Discovery(None, "no ConfigMap kube-system/descheduler"), build)
    assert st.state() == ("not_found", "no ConfigMap kube-system/descheduler") and st.usage() is None
    api.put(configmap("kube-system", "descheduler", policy("http://127.0.0.1:9")))
    with _client(api) as c:
        st._swap(discover(c, ["kube-system/descheduler"]))
        assert st.source is built[-1] and st.source.url == "http://127.0.0.1:9"
        assert st.state()[0] in ("pending", "unreachable"), st.state()  # started at once: nothing listens there
        assert st.usage() is None  # a discovered Prometheus steers only once it has answered
        api.fail(500, times=-1)
        st._swap(discover(c, ["kube-system/descheduler"]))  # cannot read the policy: keep the poller
        assert st.source is built[-1], st.state()
        api.clear_faults()
        api.delete("configmap", "kube-system", "descheduler")
        st._swap(discover(c, ["kube-system/descheduler"]))  # the policy is gone: so is steering
    assert st.source is None and st.state()[0] == "not_found" and len(built) == 1, st.state()
    st.stop()


@pytest.mark.parametrize("url, secret, token_file, sent", [
    ("https://prom:9091", None, None, None),  # the descheduler's own token: the guard has none to send
    ("https://prom:9091", None, "reader-token", "file"),  # a reader's, given to the guard
    ("https://prom:9091", ("ds", "tok"), "reader-token", "secret"),  # the very token the descheduler sends
    ("http://prom:9090", ("ds", "tok"), "reader-token", None),  # never in clear text
])
def test_a_discovered_prometheus_gets_the_descheduler_s_token_or_a_reader_s_never_the_guard_s(
        tmp_path, url, secret, token_file, sent) -> None:
    from app.cli import build_parser
    from app.metricsource.discovery import Provider
    from app.startup import discovered_source

    argv = ["report"]
    if token_file:
        (tmp_path / token_file).write_text("reader\n")
        argv += ["--prometheus-token-file", str(tmp_path / token_file)]
    args = build_parser().parse_args(argv)
    source = discovered_source(args, Provider(url, secret, "ConfigMap a/b"), api=None)
    try:
        got = ("secret" if isinstance(source.token_reader, SecretToken) else
               "file" if source.token_file else None)
        assert got == sent, (source.token_reader, source.token_file)
        assert source.token_file in (None, str(tmp_path / "reader-token"))  # never the ServiceAccount's own path
    finally:
        source.stop()


def test_explain_says_why_steering_is_off(capsys) -> None:
    code = cli_main(["explain", "-n", "vms", "--pod", "virt-launcher-rhel9-db-01-a1b2c", "--snapshot",
                     "examples/demo-snapshot.yaml", "--now", "2026-11-21T12:00:00Z", "--steering", "off", "-o", "json"])
    assert code in (0, 1)
    st = json.loads(capsys.readouterr().out)["steeringState"]
    assert (st["state"], st["why"]) == ("disabled", "--steering off"), st
