"""``clientCA`` end to end, and the canceller turned off by the chart: a second release of the chart.

The release ``guard-mtls`` (namespace ``kveg-mtls``) is installed the way most users install the chart: the webhook
calls the chart's Service (no ``webhook.url``), which the API server, run with ``--enable-aggregator-routing``,
resolves through the Service's EndpointSlice to the local guard at this machine's own address. Then, exactly as
docs/install.md ("Client certificates") tells users: the client CA into a ConfigMap, ``helm upgrade --reuse-values
--set clientCA.source=configMap --set clientCA.name=...``; the session's API server was started with
``--admission-control-config-file`` naming a kubeconfig whose user entry ``<service>.<namespace>.svc`` presents a
certificate from that CA (tests/e2e/controlplane.py, conftest ``MTLS_WEBHOOK_HOST``). The guard runs with the
upgraded Deployment's args (``--client-ca``) and is probed on its plain port, as the chart's probes are.

The release also sets ``cancelStuckEvacuations.enabled: false``: its guard reports the canceller off
(``reason="disabled"``) although virt-api serves ``evacuate/cancel`` in this session, and never asks about it.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml

from tests.e2e.cluster import eventually
from tests.e2e.conftest import GUARD_ARGS, MTLS_NAMESPACE, MTLS_RELEASE, MTLS_WEBHOOK_HOST
from tests.e2e.controlplane import host_address
from tests.e2e.guard import CHART, GuardProcess, Installation, helm, install_chart, publish_endpoint, uninstall_chart

CLIENT_CA_CONFIGMAP = "apiserver-client-ca"
DECISIONS = "kubevirt_eviction_guard_decisions_total"
CLOSED = "kubevirt_eviction_guard_connections_closed_total"


@dataclass
class Mtls:
    inst: Installation
    guard: GuardProcess
    address: str
    upgrade: str  # the helm upgrade command line, as run


@pytest.fixture(scope="module")
def mtls(control_plane, e2e_dir, guard) -> Iterator[Mtls]:
    """The second release, upgraded to clientCA as the docs say, and its guard; removed afterwards (its webhook would
    otherwise be called, and fail open, for every later eviction)."""
    cp = control_plane
    address = host_address()
    inst = install_chart(cp, e2e_dir / "mtls", release=MTLS_RELEASE, namespace=MTLS_NAMESPACE, service=True,
                         values={"cancelStuckEvacuations": {"enabled": False}})
    proc = None
    try:
        assert f"{inst.one('Service')['metadata']['name']}.{inst.namespace}.svc" == MTLS_WEBHOOK_HOST
        # docs/install.md, "Client certificates"
        cp.kubectl("-n", MTLS_NAMESPACE, "create", "configmap", CLIENT_CA_CONFIGMAP,
                   f"--from-file=ca.crt={cp.webhook_client_ca_path}")
        upgrade = ["upgrade", MTLS_RELEASE, str(CHART), "-n", MTLS_NAMESPACE, "--reuse-values",
                   "--set", "clientCA.source=configMap", "--set", f"clientCA.name={CLIENT_CA_CONFIGMAP}"]
        helm(cp, *upgrade)
        inst.manifests = [d for d in yaml.safe_load_all(
            helm(cp, "get", "manifest", MTLS_RELEASE, "--namespace", MTLS_NAMESPACE)) if d]
        deployment = inst.get("deployment", inst.fullname)
        (container,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "guard"]
        client_ca = next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--client-ca="))
        publish_endpoint(inst, address, inst.port)
        proc = GuardProcess(inst, GUARD_ARGS, name="mtls-guard", host=address,
                            files={client_ca: cp.webhook_client_ca_path}, probe="metrics").start()
        yield Mtls(inst, proc, address, "helm " + " ".join(upgrade).replace(str(CHART), "$CHART"))
    finally:
        if proc is not None:
            proc.stop()
        cp.kubectl("-n", MTLS_NAMESPACE, "delete", "endpointslice", f"{inst.fullname}-e2e", "--ignore-not-found",
                   check=False)
        uninstall_chart(inst)


def handshake(address: str, port: int, server_name: str, ca, cert: tuple | None, path: str = "/readyz") -> str:
    """A TLS connection to the guard and one HTTP GET of ``path``; the status or what ended it."""
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    try:
        with socket.create_connection((address, port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname=server_name) as tls:
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n".encode())
            data = tls.recv(4096)  # a TLS 1.3 server's refusal of the client's certificate arrives here
            return data.split(b" ", 2)[1].decode() if data else "closed"
    except (ssl.SSLError, ConnectionError) as e:
        return f"{type(e).__name__}: {getattr(e, 'reason', None) or e}"


@pytest.mark.check("client certificates")
def test_evictions_answered_with_the_api_servers_certificate_and_others_refused_at_tls(mtls, cluster, control_plane,
                                                                                      detail):
    inst, g, cp = mtls.inst, mtls.guard, control_plane
    args = g.chart_args
    assert any(a.startswith("--client-ca=") for a in args), args
    hook = inst.webhook_configuration["webhooks"][0]
    assert hook["clientConfig"]["service"] == {"name": inst.fullname, "namespace": inst.namespace, "port": 443,
                                               "path": "/mutate"}, hook["clientConfig"]
    # the API server calls the guard's Service (its EndpointSlice: this machine's address) and presents the
    # certificate its webhook kubeconfig names for that host; the guard answers
    ns = cluster.fresh_namespace("mtls")
    vm = cluster.vm(ns, "quiet", cluster.fresh_node())
    cluster.sync()
    cluster.sync(g)
    before = g.metric(DECISIONS)
    code, body = cluster.evict(ns, vm.pod_name, dry_run=True, descheduler=True)
    assert code == 201, body
    audit = cluster.audit_of_eviction(ns, vm.pod_name)
    annotations = audit["annotations"]
    assert annotations.get(f"{inst.webhook_name}/reason") == "allowed", annotations
    assert annotations.get(f"{inst.webhook_name}/dry-run") == "true", annotations
    assert not [k for k in annotations if k.startswith("failed-open.")], annotations
    assert g.metric(DECISIONS) == before + 1

    # at the guard's port, as the API server reaches it (the Service's DNS name is what its certificate names): only
    # a client with a certificate from the client CA reaches the admission paths (GET /mutate: 405 from the app);
    # without a certificate the answer is 403 (counted as client_certificate), and a certificate of another CA
    # ends the handshake (counted as tls_handshake). Probes need no certificate: /readyz answers a kubelet-like
    # client (no verification, no certificate) on the same port.
    ca = inst.certs["ca"]
    answers = {}
    for who, cert, reason in (("the API server's certificate", cp.webhook_client_cert, "tls_handshake"),
                              ("no certificate", None, "client_certificate"),
                              ("a certificate of another CA", (cp.dir / "admin.crt", cp.dir / "admin.key"),
                               "tls_handshake")):
        closed = g.metric(CLOSED, listener="webhook", reason=reason)
        answer = handshake(mtls.address, g.port, MTLS_WEBHOOK_HOST, ca, cert, path="/mutate")
        if answer != "405":  # the count is written after the connection ends: wait for it
            eventually(lambda c=closed, r=reason: g.metric(CLOSED, listener="webhook", reason=r) > c, 5,
                       f"the refusal counted as {reason}")
        answers[who] = (answer, int(g.metric(CLOSED, listener="webhook", reason=reason) - closed))
    assert answers["the API server's certificate"] == ("405", 0), answers
    assert answers["no certificate"] == ("403", 1), answers
    answer, refused = answers["a certificate of another CA"]
    # no HTTP answer: the guard ends the connection without a TLS alert (its TLS layer, uvloop's, aborts)
    assert refused == 1 and answer.startswith(("closed", "SSLError", "ConnectionResetError")), answer
    kubelet = ssl.create_default_context()
    kubelet.check_hostname, kubelet.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection((mtls.address, g.port), timeout=5) as raw, kubelet.wrap_socket(raw) as probe:
        probe.sendall(b"GET /readyz HTTP/1.1\r\nHost: guard\r\nConnection: close\r\n\r\n")
        assert probe.recv(4096).split(b" ", 2)[1] == b"200"  # the chart's probes: the webhook port, no certificate
    assert g.readyz() == (200, {"ready": True, "stale": []})

    # the kubeconfig entry is what makes the API server present it: with service.port 8443 the webhook's host is
    # "<service>.<namespace>.svc:8443", no entry names it, the API server calls without a certificate, the guard
    # answers 403, and the eviction fails open (failurePolicy Ignore), as docs/install.md warns
    helm(cp, "upgrade", MTLS_RELEASE, str(CHART), "-n", MTLS_NAMESPACE, "--reuse-values", "--set", "service.port=8443")
    closed = g.metric(CLOSED, listener="webhook", reason="client_certificate")
    code, body = cluster.evict(ns, vm.pod_name, dry_run=True, descheduler=True)
    assert code == 201, body
    opened = cluster.audit_of_eviction(ns, vm.pod_name, after=1)["annotations"]
    failed_open = {k: v for k, v in opened.items() if k.startswith("failed-open.")}
    assert list(failed_open.values()) == [inst.webhook_name], opened
    said = eventually(lambda: [line for line in cp.apiserver.log.read_text(errors="replace").splitlines()
                               if "failing open" in line and inst.webhook_name in line and "failed to call webhook" in line], 10,
                      "the API server's log line of the failed call")
    assert f"{inst.webhook_name}/reason" not in opened, opened
    assert g.metric(CLOSED, listener="webhook", reason="client_certificate") > closed
    assert g.metric(DECISIONS) == before + 1  # the guard never judged that review
    detail["detail"] = (f"release {MTLS_RELEASE} (webhook -> Service {MTLS_WEBHOOK_HOST}:443 -> EndpointSlice "
                        f"{mtls.address}:{g.port}), then `{mtls.upgrade}`: guard runs with --client-ca; kube-apiserver "
                        "with --admission-control-config-file (WebhookAdmissionConfiguration kubeconfig, user "
                        f"{MTLS_WEBHOOK_HOST}): a launcher pod's eviction answered by this guard (audit: "
                        f"{inst.webhook_name}/reason=allowed, no failed-open); at its port: "
                        + ", ".join(f"{who}: GET /mutate {a} ({n} counted refusal(s))" for who, (a, n) in answers.items())
                        + "; a probe without a certificate on the webhook port 200. With service.port 8443 (no "
                        f"kubeconfig entry for {MTLS_WEBHOOK_HOST}:8443) the API server called without a certificate: "
                        "403, "
                        f"eviction failed open (audit {next(iter(failed_open))}); the API server logged: "
                        + said[-1][said[-1].index("failed to call webhook"):])


@pytest.mark.check("canceller off when the chart disables it")
def test_the_chart_can_turn_the_canceller_off(mtls, control_plane, virt_api, detail):
    inst, g, cp = mtls.inst, mtls.guard, control_plane
    assert "--no-cancel-stuck-evacuations" in g.chart_args, g.chart_args
    assert g.metric("kubevirt_eviction_guard_evacuation_canceller_info", enabled="false", reason="disabled") == 1
    assert g.metric("kubevirt_eviction_guard_evacuation_canceller_info", reason="enabled") == 0
    rules = [r for r in inst.one("ClusterRole")["rules"] if "subresources.kubevirt.io" in r["apiGroups"]]
    assert rules == [], rules
    # although KubeVirt serves evacuate/cancel here (the session's virt-api stand-in), it never asked
    with cp.admin_http(timeout=10) as c:
        assert c.get("/apis/subresources.kubevirt.io/v1").status_code == 200
    calls = cp.audit_events(inst.username)
    assert calls, "no request of the second guard"
    asked = [e for e in calls if e.get("objectRef", {}).get("resource") == "selfsubjectaccessreviews"
             or "subresources.kubevirt.io" in e["requestURI"]]
    assert not asked, asked
    logged = eventually(lambda: [d for d in g.logs() if d.get("cancelStuckEvacuations") is False
                                 or d.get("server", {}).get("cancelStuckEvacuations") is False], 10,
                        "the start line's settings")
    detail["detail"] = ("cancelStuckEvacuations.enabled=false: --no-cancel-stuck-evacuations, "
                        "evacuation_canceller_info{enabled=\"false\",reason=\"disabled\"} 1, no subresources.kubevirt.io "
                        f"rule in the ClusterRole, no SelfSubjectAccessReview or discovery of it in {len(calls)} "
                        f"requests of {inst.username} although virt-api serves it; start line "
                        f"cancelStuckEvacuations={logged[0].get('server', {}).get('cancelStuckEvacuations')}")
