"""The image and the chart as users install them, on one real node (tests/e2e/node.py) probed by a real kubelet.

`make image` builds the image (image/build.sh); containerd imports the OCI archive; the chart is installed by
``helm install`` with its default values but the image reference: Helm-generated certificates, the webhook
registered by Service (the API server, with ``--enable-aggregator-routing``, calls the Service's endpoints: the pods'
own addresses on the node's bridge), two replicas, the PodDisruptionBudget, kubelet probes on the webhook's port.

The checks run in file order on one node and one release, each starting from two Ready replicas. Admissions under
load are dry-run evictions of a VM marked for evacuation, sent as the admin over HTTPS: the guard answers each with
429 (evacuation pending); a 201 is the API server failing open (``failurePolicy: Ignore``, confirmed by its
``failed-open.mutation.webhook.admission.k8s.io`` audit annotation), anything else an error.
"""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import subprocess
import tarfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.cluster import Cluster
from tests.e2e.controlplane import ROOT
from tests.e2e.guard import CHART, helm
from tests.e2e.node import (IMAGE_ARCHIVE, IMAGE_REPOSITORY, NODE_INFO, NODES_DIR, Node, _cgroup_hierarchies,
                             process_start, reap_stale_nodes, versions)
from tests.e2e.test_helm_versions import (HOOK_KINDS, WEBHOOK, describe, hook_user, install_upgrade_rotate,
                                          leftovers, uninstall)
from tests.live_support import eventually

# the image build (minutes when cold) and the node's start are in the first test's fixtures
pytestmark = pytest.mark.timeout(1800)

RELEASE, NAMESPACE = "guard", "kubevirt-eviction-guard"
FULLNAME = f"{RELEASE}-kubevirt-eviction-guard"
SELECTOR = f"app.kubernetes.io/instance={RELEASE}"
FAILED_OPEN = "failed-open.mutation.webhook.admission.k8s.io/round_0_index_0"


# ---- the image ----------------------------------------------------------------


def oci_image(archive: Path) -> tuple[dict, dict, list[tarfile.TarInfo]]:
    """(index.json's manifest entry, the image config, the members of its layers) of an OCI archive."""
    with tarfile.open(archive) as t:
        def blob(digest: str) -> bytes:
            return t.extractfile(f"./blobs/sha256/{digest.split(':')[1]}").read()
        (entry,) = json.loads(t.extractfile("./index.json").read())["manifests"]
        manifest = json.loads(blob(entry["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        members = []
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=io.BytesIO(blob(layer["digest"]))) as lt:
                members += lt.getmembers()
                status = next((m for m in members if m.name.lstrip("./") == "var/lib/dpkg/status"), None)
                if status is not None:
                    config["_dpkg_status"] = lt.extractfile(status).read().decode()
    return entry, config, members


@pytest.fixture(scope="session")
def image(request: pytest.FixtureRequest) -> dict:
    """``make image`` (cached when its inputs are unchanged), and what the archive holds."""
    out = subprocess.run(["bash", str(ROOT / "image" / "build.sh")], capture_output=True, text=True, timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    entry, config, members = oci_image(IMAGE_ARCHIVE)
    key = subprocess.run(["bash", str(ROOT / "image" / "build.sh"), "--key"], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    info = {"tag": entry["annotations"]["org.opencontainers.image.ref.name"], "config": config["config"],
            "members": members, "dpkg": config.get("_dpkg_status", ""),
            "size_mb": round(IMAGE_ARCHIVE.stat().st_size / 2**20, 1),
            "unpacked_mb": round(sum(m.size for m in members) / 2**20, 1), "build": out.stdout.strip().splitlines()[-1],
            "key": key, "archive_key": (IMAGE_ARCHIVE.parent / "key").read_text().strip(),
            # built here, or copied from the per-user cache by its key (image/build.sh writes which)
            "made": (IMAGE_ARCHIVE.parent / "made").read_text().strip()}
    line = (f"image: {IMAGE_ARCHIVE} {info['size_mb']} MB ({info['unpacked_mb']} MB unpacked), "
            f"user {config['config']['User']}")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is not None and reporter is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("\n" + line)
    else:
        print(line)
    return info


@pytest.mark.check("image built")
def test_image_built_by_the_recipe(image, detail):
    config = image["config"]
    # the archive checked is the one of this tree's inputs, whether built now or reused from the cache
    assert image["archive_key"] == image["key"], image
    assert image["made"].startswith(("built in ", "reused from cache ")), image["made"]
    recipe = dict(line.split("=", 1) for line in (ROOT / "image" / "config").read_text().splitlines()
                  if line and not line.startswith("#") and not line.startswith(("ENV=", "EXPOSE=")))
    assert config["User"] == recipe["USER"] == "10001:10001"
    assert config["Entrypoint"] == recipe["ENTRYPOINT"].split() == ["kubevirt-eviction-guard", "serve"]
    assert not config.get("Cmd")
    assert "PATH=/opt/guard/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in config["Env"]
    names = {m.name.lstrip("./") for m in image["members"]}
    assert "opt/guard/bin/kubevirt-eviction-guard" in names and "usr/bin/python3.11" in names
    # no installer anywhere in the running image
    installers = sorted(n for n in names if "/site-packages/pip/" in n or "/site-packages/setuptools/" in n
                        or "/ensurepip/" in n or n.endswith("/bin/pip") or n.endswith("/bin/pip3"))
    assert installers == [], installers[:5]
    installed = {b.split("\n", 1)[0].removeprefix("Package: ") for b in image["dpkg"].split("\n\n") if b.strip()}
    assert "python3" in installed and not installed & {"python3-pip", "python3-venv", "gcc", "libc6-dev"}
    passwd = next(m for m in image["members"] if m.name.lstrip("./") == "etc/passwd")
    detail["detail"] = (f"make image: {IMAGE_ARCHIVE.name} tag {image['tag']}, {image['size_mb']} MB "
                        f"({image['unpacked_mb']} MB unpacked, {len(installed)} Debian packages), user "
                        f"{config['User']}, entrypoint {' '.join(config['Entrypoint'])}, no pip/setuptools/ensurepip; "
                        f"key {image['key']}, {image['made']}")
    assert passwd.size > 0


# ---- the node and the release ------------------------------------------------------


@pytest.fixture(scope="session")
def node(binaries: Path, e2e_dir: Path, image: dict):
    n = Node(e2e_dir / "node", binaries)
    started = time.monotonic()
    n.start()
    NODE_INFO.update(versions(binaries), start_seconds=round(time.monotonic() - started, 1),
                     reaped=[r["id"] for r in n.reaped])
    try:
        n.cp.install_crds()
        n.import_image(IMAGE_ARCHIVE, IMAGE_REPOSITORY)
        yield n
    finally:
        n.stop()
        left = n.leftovers()
        NODE_INFO["left_behind"] = left
        assert left == {}, f"the node left things behind: {left}"


class Guards:
    """The release's pods as the tests see them: through the API server (their /metrics by the pods proxy)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.cp = node.cp

    def pods(self) -> list[dict]:
        return json.loads(self.cp.kubectl("-n", NAMESPACE, "get", "pods", "-l", SELECTOR, "-o", "json").stdout)["items"]

    def ready(self) -> list[dict]:
        return [p for p in self.pods() if not p["metadata"].get("deletionTimestamp") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]

    def wait_ready(self, n: int = 2, timeout: float = 180) -> list[dict]:
        return eventually(lambda: (r := self.ready()) and len(r) == n and len(self.pods()) == n and r, timeout,
                          f"{n} Ready replicas", every=1)

    def restarts(self) -> dict[str, int]:
        return {p["metadata"]["name"]: sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", []))
                for p in self.pods()}

    def metric(self, name: str, **labels: str) -> float:
        """The smallest value over the Ready replicas (each sums ``name`` over the series with ``labels``)."""
        want = set(labels.items())
        values = []
        for p in self.ready():
            text = self.cp.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/http:{p['metadata']['name']}"
                                   ":8080/proxy/metrics").stdout
            values.append(sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                              if s.name == name and want <= set(s.labels.items())))
        return min(values) if values else 0

    def metric_by_pod(self, name: str) -> dict[str, float]:
        """``name`` (one series, no labels) on each Ready replica."""
        out = {}
        for p in self.ready():
            text = self.cp.kubectl("get", "--raw", f"/api/v1/namespaces/{NAMESPACE}/pods/http:{p['metadata']['name']}"
                                   ":8080/proxy/metrics").stdout
            out[p["metadata"]["name"]] = next(s.value for fam in text_string_to_metric_families(text)
                                              for s in fam.samples if s.name == name)
        return out

    def pid(self, pod: dict) -> int:
        """The guard's PID on this machine (found in the pod's cgroup, under the test's own)."""
        uid = pod["metadata"]["uid"]
        pids = [p for p in self.node.container_pids("kubevirt-eviction-guard")
                if uid.replace("-", "_") in Path(f"/proc/{p}/cgroup").read_text()
                or uid in Path(f"/proc/{p}/cgroup").read_text()]
        assert len(pids) == 1, (pod["metadata"]["name"], pids)
        return pids[0]


@pytest.fixture(scope="session")
def release(node: Node, e2e_dir: Path):
    """``helm install`` with the chart's defaults but the image reference."""
    cp = node.cp
    cp.kubectl("create", "namespace", NAMESPACE)
    values = e2e_dir / "node-values.yaml"
    values.write_text(yaml.safe_dump({"image": {"repository": IMAGE_REPOSITORY, "tag": _image_tag()}}))
    started = time.monotonic()
    helm(cp, "install", RELEASE, str(CHART), "-n", NAMESPACE, "--values", str(values), timeout=300)
    guards = Guards(node)
    guards.wait_ready()
    guards.install_seconds = round(time.monotonic() - started, 1)
    guards.values = values
    return guards


def _image_tag() -> str:
    with tarfile.open(IMAGE_ARCHIVE) as t:
        (entry,) = json.loads(t.extractfile("./index.json").read())["manifests"]
    return entry["annotations"]["org.opencontainers.image.ref.name"]


@pytest.fixture(scope="session")
def node_cluster(node: Node, release: Guards) -> Cluster:
    return Cluster(node.cp, release)


@pytest.fixture(scope="session")
def marked(node_cluster: Cluster):
    """A VM marked for evacuation (the guard denies its evictions: 429) and a quiet one (allowed)."""
    ns = node_cluster.fresh_namespace("node-vms")
    n1, n2 = node_cluster.fresh_node(), node_cluster.fresh_node()
    vm = node_cluster.vm(ns, "marked", n1, evacuation_node=n1)
    quiet = node_cluster.vm(ns, "quiet", n2)
    node_cluster.sync()
    return ns, vm, quiet


class Stream:
    """Dry-run evictions of the marked VM, back to back on one thread, each classified by its answer and audit."""

    def __init__(self, cluster: Cluster, ns: str, pod: str) -> None:
        self.cluster, self.ns, self.pod = cluster, ns, pod
        self.results: list[tuple[int, str]] = []  # (status, audit ID)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": self.pod, "namespace": self.ns},
                "deleteOptions": {"dryRun": ["All"]}}
        with self.cluster.cp.admin_http(timeout=30) as http:
            while not self._stop.is_set():
                try:
                    r = http.post(f"/api/v1/namespaces/{self.ns}/pods/{self.pod}/eviction", json=body)
                    self.results.append((r.status_code, r.headers.get("audit-id", "")))
                except Exception as e:  # noqa: BLE001 - a transport error is a result too
                    self.results.append((-1, type(e).__name__))
                time.sleep(0.02)

    def __enter__(self) -> "Stream":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)

    def tally(self) -> dict:
        """answered (429 by the guard), failed_open (201, with the API server's failed-open annotation), errors."""
        audits = {e.get("auditID"): e for e in self.cluster.cp.audit_events()}
        out = Counter()
        for code, audit_id in self.results:
            annotations = audits.get(audit_id, {}).get("annotations", {})
            if code == 429:
                out["answered"] += 1
            elif code == 201 and FAILED_OPEN in annotations:
                out["failed_open"] += 1
            else:
                out[f"error_{code}"] += 1
        out["total"] = len(self.results)
        return dict(out)


# ---- checks ------------------------------------------------------------------------


@pytest.mark.check("chart on a real node")
def test_chart_on_a_real_node(node, release, node_cluster, marked, detail):
    cp = node.cp
    pods = release.wait_ready()
    live = {(p["spec"]["nodeName"], p["status"]["podIP"]) for p in pods}
    assert {n for n, _ in live} == {Node.NAME}
    webhook = json.loads(cp.kubectl("get", "mutatingwebhookconfiguration", FULLNAME, "-o", "json").stdout)
    (hook,) = webhook["webhooks"]
    assert hook["clientConfig"]["service"] == {"name": FULLNAME, "namespace": NAMESPACE, "path": "/mutate", "port": 443}
    secret = json.loads(cp.kubectl("-n", NAMESPACE, "get", "secret", "-o", "json").stdout)["items"]
    assert any(s["type"] == "kubernetes.io/tls" and s["metadata"]["labels"].get("app.kubernetes.io/managed-by") == "Helm"
               for s in secret), "the Helm-generated serving certificate"
    # the running processes, as the kernel sees them: the chart's securityContext applied by runc
    seen = []
    for p in pods:
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{release.pid(p)}/status").read_text().splitlines()
                      if ":\t" in line)
        uid, gid = status["Uid"].split()[0], status["Gid"].split()[0]
        assert (uid, gid) == ("10001", "10001"), status["Uid"]
        assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2", status
        assert status["CapEff"].strip() == "0000000000000000"
        mounts = Path(f"/proc/{release.pid(p)}/mountinfo").read_text().splitlines()
        root = next(m.split() for m in mounts if m.split()[4] == "/")
        assert "ro" in root[5].split(","), root
        seen.append(f"uid {uid} gid {gid}, NoNewPrivs 1, Seccomp 2 (filter), no capabilities, / read-only")
    # the API server calls the in-cluster guard through its Service
    ns, vm, quiet = marked
    cluster = node_cluster
    hook_name = hook["name"]
    code, body = cluster.evict(ns, quiet.pod_name, dry_run=True)
    assert code == 201, body
    dry = cluster.audit_of_eviction(ns, quiet.pod_name)
    assert dry["annotations"][f"{hook_name}/reason"] == "allowed" and dry["annotations"][f"{hook_name}/dry-run"] == "true"
    code, body = cluster.evict(ns, vm.pod_name, descheduler=True)
    assert code == 429 and f'admission webhook "{hook_name}" denied the request' in body["message"], body
    eventually(lambda: cluster.objects.get_pod(ns, vm.pod_name)["metadata"]["annotations"].get(
        "descheduler.alpha.kubernetes.io/eviction-in-progress"), 20, "the annotation patch", every=0.5)
    events = eventually(lambda: [e for e in cluster.core.list_namespaced_event(ns).items
                                 if e.involved_object.name == "marked" and e.reason == "EvictionBlocked"],
                        30, "the guard's Event", every=0.5)
    code, body = cluster.evict(ns, quiet.pod_name, descheduler=True)
    assert code == 201, body
    allowed = cluster.audit_of_eviction(ns, quiet.pod_name, after=1)
    assert allowed["annotations"][f"{hook_name}/reason"] == "allowed"
    detail["detail"] = (f"helm install (defaults but image {IMAGE_REPOSITORY}:{_image_tag()}) -> 2 Ready replicas on "
                        f"{Node.NAME} at {sorted(ip for _, ip in live)} in {release.install_seconds} s; webhook by "
                        f"Service {FULLNAME}:443, Helm-generated certificate; {seen[0]}; through the Service: dry run "
                        f"allowed, eviction denied 429 with the annotation patch and Event {events[0].reason}, "
                        "eviction allowed 201")


@pytest.mark.check("kubelet probes")
def test_kubelet_probes(node, release, detail):
    pods = release.wait_ready()
    probes = {}
    for p in pods:
        (c,) = p["spec"]["containers"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            probes[kind] = c[kind]["httpGet"]
            assert c[kind]["httpGet"]["port"] == "https" and c[kind]["httpGet"]["scheme"] == "HTTPS"
        (cs,) = p["status"]["containerStatuses"]
        assert cs["ready"] and cs["started"] and cs["restartCount"] == 0, cs
    # kubelet's own record of the probes it ran (its prober logs each result change at -v 2 and up)
    log = (node.dir / "kubelet.log").read_text(errors="replace")
    assert "prober" in log or "Probe" in log
    detail["detail"] = ("both replicas started, Ready, 0 restarts; probes: " +
                        ", ".join(f"{k} {v['scheme']} {v['path']} on port {v['port']}" for k, v in probes.items()))


@pytest.mark.check("probes see the webhook")
def test_probes_see_the_webhook(node, release, node_cluster, marked, detail):
    """One replica's guard stopped (SIGSTOP by PID from here: its webhook stalls, the process lives); the other
    takes a flood of evictions. Kubelet restarts the stalled one and never the healthy one."""
    ns, vm, _ = marked
    stalled, healthy = release.wait_ready()
    before = release.restarts()
    pid = release.pid(stalled)
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    with Stream(node_cluster, ns, vm.pod_name) as stream:
        eventually(lambda: release.restarts().get(stalled["metadata"]["name"], 0) > before[stalled["metadata"]["name"]],
                   240, "kubelet to restart the stalled guard", every=1)
        restarted_after = round(time.monotonic() - t0)
        release.wait_ready()
    tally = stream.tally()
    after = release.restarts()
    assert after[healthy["metadata"]["name"]] == before[healthy["metadata"]["name"]], (before, after)
    assert tally.get("answered", 0) > 0
    events = [e for e in node_cluster.core.list_namespaced_event(NAMESPACE).items
              if e.involved_object.name == stalled["metadata"]["name"] and e.reason == "Unhealthy"]
    liveness = [e.message for e in events if "Liveness probe failed" in (e.message or "")]
    assert liveness, [e.message for e in events]
    detail["detail"] = (f"SIGSTOP of {stalled['metadata']['name']}'s guard (pid {pid}): kubelet's liveness probe failed "
                        f"({liveness[0][:90]!r}), container restarted after {restarted_after} s; "
                        f"{healthy['metadata']['name']} under {tally['total']} evictions: 0 restarts; {tally}")


@pytest.mark.check("replica killed under load")
def test_replica_killed_under_load(node, release, node_cluster, marked, detail):
    ns, vm, _ = marked
    victim, _ = release.wait_ready()
    with Stream(node_cluster, ns, vm.pod_name) as stream:
        time.sleep(3)
        os.kill(release.pid(victim), signal.SIGKILL)
        time.sleep(3)
        release.wait_ready()
        time.sleep(2)
    tally = stream.tally()
    errors = {k: v for k, v in tally.items() if k.startswith("error")}
    assert errors == {}, tally
    detail["detail"] = (f"SIGKILL of {victim['metadata']['name']}'s guard under a stream of {tally['total']} evictions:"
                        f" {tally.get('answered', 0)} answered by a guard, {tally.get('failed_open', 0)} failed open "
                        "(failurePolicy Ignore, the API server's failed-open annotation), 0 errors")


@pytest.mark.check("rolling upgrade")
def test_rolling_upgrade(node, release, node_cluster, marked, detail):
    ns, vm, _ = marked
    old = {p["metadata"]["name"] for p in release.wait_ready()}
    with Stream(node_cluster, ns, vm.pod_name) as stream:
        time.sleep(2)
        helm(node.cp, "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--values", str(release.values),
             "--set-string", "podAnnotations.e2e/rollout=1", "--wait", "--timeout", "5m", timeout=360)
        new = eventually(lambda: (r := release.wait_ready()) and not old & {p["metadata"]["name"] for p in r} and r,
                         120, "both replicas replaced", every=1)
        time.sleep(2)
    tally = stream.tally()
    assert tally.get("answered", 0) == tally["total"], tally
    detail["detail"] = (f"helm upgrade rolled {sorted(old)} -> {sorted(p['metadata']['name'] for p in new)} under "
                        f"{tally['total']} evictions: all answered by a guard (0 failed open, 0 errors)")


@pytest.mark.check("certificate rotation under load")
def test_certificate_rotation_under_load(node, release, node_cluster, marked, detail):
    """Rotation of the Helm-generated pair: delete its Secret, ``helm upgrade``. The chart generates a new CA and
    serving certificate, and the webhook's caBundle holds the new CA beside the previous one. The pods are not
    restarted: kubelet refreshes the mounted Secret and the guard reloads it (``server.tlsReloadInterval``); until
    then they serve the old pair, which the API server still trusts. No call fails open."""
    ns, vm, _ = marked
    cp = node.cp
    pods = {p["metadata"]["name"] for p in release.wait_ready()}
    restarts = release.restarts()
    secret = f"{FULLNAME}-tls"
    expiry = "kubevirt_eviction_guard_tls_certificate_expiry_timestamp_seconds"

    def served(name: str) -> x509.Certificate:
        data = json.loads(cp.kubectl("-n", NAMESPACE, "get", "secret", secret, "-o", "json").stdout)["data"]
        return x509.load_pem_x509_certificate(base64.b64decode(data[name]))

    old_ca, old_cert = served("ca.crt"), served("tls.crt")
    assert set(release.metric_by_pod(expiry).values()) == {old_cert.not_valid_after_utc.timestamp()}
    with Stream(node_cluster, ns, vm.pod_name) as stream:
        time.sleep(2)
        cp.kubectl("-n", NAMESPACE, "delete", "secret", secret)
        helm(cp, "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values", "--wait", timeout=300)
        upgraded = time.monotonic()
        new_ca, new_cert = served("ca.crt"), served("tls.crt")
        assert new_ca != old_ca and new_cert.not_valid_after_utc != old_cert.not_valid_after_utc
        hook = json.loads(cp.kubectl("get", "mutatingwebhookconfiguration", FULLNAME, "-o", "json").stdout)
        bundle = x509.load_pem_x509_certificates(base64.b64decode(hook["webhooks"][0]["clientConfig"]["caBundle"]))
        assert bundle == [new_ca, old_ca], bundle
        during = len(stream.results)
        # every replica serves the new certificate: its expiry is what the guard exports
        eventually(lambda: set(release.metric_by_pod(expiry).values()) == {new_cert.not_valid_after_utc.timestamp()},
                   180, "both replicas serving the new certificate", every=0.5)
        reloaded = round(time.monotonic() - upgraded, 1)
        n = len(stream.results)
        eventually(lambda: len(stream.results) > n + 50, 60, "50 more evictions on the new certificate", every=0.2)
    tally = stream.tally()
    assert tally.get("answered", 0) == tally["total"] and tally["total"] > during, tally  # none failed open, no error
    assert {p["metadata"]["name"] for p in release.ready()} == pods and release.restarts() == restarts
    detail["detail"] = (f"Secret {secret} deleted, helm upgrade: new CA, caBundle = new CA + previous CA, same pods, "
                        f"0 restarts; both replicas served the new certificate {reloaded} s after the upgrade returned "
                        f"(kubelet's Secret refresh, then the guard's reload); under {tally['total']} evictions: "
                        f"{tally.get('answered', 0)} answered by a guard, 0 failed open, 0 errors")


@pytest.mark.check("drain of the guard's node")
def test_drain_of_the_guards_node(node, release, node_cluster, marked, detail):
    """One node holds both replicas. ``kubectl drain`` evicts one; its replacement cannot be scheduled (the node is
    cordoned), so the chart's PDB (maxUnavailable 1) refuses the second eviction until the drain times out: the
    webhook keeps a replica. The guard itself never answers for its own pods (its match condition leaves them out).
    Then ``kubectl drain --disable-eviction`` (deletes, no PDB) leaves no Ready replica: the Service has no endpoint,
    the API server cannot call the webhook and, with ``failurePolicy: Ignore``, lets the eviction through."""
    ns, vm, _ = marked
    cp = node.cp
    pods = release.wait_ready()
    hook = json.loads(cp.kubectl("get", "mutatingwebhookconfiguration", FULLNAME, "-o", "json").stdout)
    hook_name = hook["webhooks"][0]["name"]
    out = cp.kubectl("drain", Node.NAME, "--ignore-daemonsets", "--delete-emptydir-data", "--timeout", "20s",
                     check=False, timeout=60)
    drained = out.stdout + out.stderr
    assert out.returncode != 0 and "evicted" in drained, drained
    evicted = {line.split("/")[1].split()[0] for line in drained.splitlines() if line.endswith(" evicted")}
    assert len(evicted) == 1, drained
    kept = [p["metadata"]["name"] for p in pods if p["metadata"]["name"] not in evicted]
    audits = [e for e in cp.audit_events() if e.get("objectRef", {}).get("subresource") == "eviction"
              and e["objectRef"].get("namespace") == NAMESPACE]
    refused = [e for e in audits if e["objectRef"]["name"] in kept and e.get("responseStatus", {}).get("code") == 429]
    assert refused, "the PDB refused the last replica's eviction"
    assert not [e for e in audits if any(k.startswith(hook_name) for k in e.get("annotations", {}))], \
        "the guard was called for its own pods"
    # the remaining replica still answers
    assert node_cluster.evict(ns, vm.pod_name, dry_run=True)[0] == 429
    out = cp.kubectl("drain", Node.NAME, "--ignore-daemonsets", "--delete-emptydir-data", "--disable-eviction",
                     "--timeout", "120s", timeout=150)
    eventually(lambda: not release.ready(), 60, "no Ready replica", every=0.5)
    n = node_cluster.evictions_audited(ns, vm.pod_name)
    code, _ = node_cluster.evict(ns, vm.pod_name, dry_run=True)
    audit = node_cluster.audit_of_eviction(ns, vm.pod_name, after=n)
    assert code == 201 and FAILED_OPEN in audit["annotations"], (code, audit.get("annotations"))
    cp.kubectl("uncordon", Node.NAME)
    release.wait_ready()
    assert node_cluster.evict(ns, vm.pod_name, dry_run=True)[0] == 429
    detail["detail"] = (f"kubectl drain {Node.NAME} (both replicas on it): {sorted(evicted)} evicted, the PDB refused "
                        f"{kept} {len(refused)} times until the drain's timeout (its replacement Pending on the "
                        "cordoned node), no call of the guard for its own pods, the webhook still answered (429); "
                        "drain --disable-eviction: no Ready replica, the marked VM's eviction went through (201, audit "
                        f"{FAILED_OPEN}: {audit['annotations'][FAILED_OPEN][:100]!r}); uncordon: 2 Ready, 429 again")


@pytest.mark.check("uninstall leaves nothing")
def test_uninstall_leaves_nothing(node, release, detail):
    cp = node.cp
    helm(cp, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "3m", timeout=200)
    eventually(lambda: not release.pods(), 90, "the release's pods gone", every=1)
    left = {}
    for kind, namespaced in (("mutatingwebhookconfigurations", False), ("validatingwebhookconfigurations", False),
                             ("clusterroles", False), ("clusterrolebindings", False), ("roles", True),
                             ("rolebindings", True), ("secrets", True), ("configmaps", True), ("serviceaccounts", True),
                             ("services", True), ("deployments", True), ("poddisruptionbudgets", True),
                             ("networkpolicies", True), ("pods", True)):
        args = ["get", kind, "-l", SELECTOR, "-o", "name"] + (["-A"] if namespaced else [])
        names = cp.kubectl(*args).stdout.split()
        if names:
            left[kind] = names
    secrets = cp.kubectl("-n", NAMESPACE, "get", "secrets", "-o", "name").stdout.split()
    left_secrets = [s for s in secrets if "guard" in s]
    assert left == {} and left_secrets == [], (left, left_secrets)
    detail["detail"] = ("helm uninstall: no webhook configuration, RBAC, Secret, ConfigMap, ServiceAccount, Service, "
                        "Deployment, PDB, NetworkPolicy or pod of the release left")


@pytest.mark.check("helm 3 and helm 4")
def test_helm3_uninstall_hook_on_the_real_node(node, release, image, e2e_dir, detail):
    """Helm 3 renders the chart's ``pre-delete`` hook; here, with a kubelet, its Job (the guard's image,
    ``kubevirt-eviction-guard unregister``) runs: the webhook configuration is deleted first, by the hook's own
    ServiceAccount, before Helm deletes the Service, the Deployment and the RBAC, and the hook's objects go too.
    Then a Job that cannot run (an image no one can pull): the uninstall fails at the Job's deadline instead of
    hanging, and ``helm uninstall --no-hooks`` removes the release and leaves nothing. Runs after the session's
    release is uninstalled: these releases' webhooks see no other test's evictions."""
    cp = node.cp
    values = e2e_dir / "node-values.yaml"  # the image reference, as the session's release
    h3 = install_upgrade_rotate(cp, "helm3", "guard-h3", "kveg-helm3", "--values", str(values))
    assert set(h3["hooks"]) == HOOK_KINDS, h3["hooks"]
    h3 = uninstall(cp, h3)
    assert h3["webhook_first"] and h3["order"][0] == WEBHOOK, h3["order"]
    assert h3["webhook_by"] == hook_user("guard-h3", "kveg-helm3"), h3["webhook_by"]
    name = h3["name"] + "-unregister"
    assert set(h3["hook_deleted"]) == {f"{r}/{name}" for r in ("jobs", "serviceaccounts", "clusterroles",
                                                                "clusterrolebindings")}, h3["hook_deleted"]
    eventually(lambda: not cp.kubectl("-n", "kveg-helm3", "get", "pods", "-o", "name").stdout.split(), 120,
               "the release's and the hook's pods gone", every=1)

    stuck, ns = "guard-stuck", "kveg-helm3-stuck"
    helm(cp, "install", stuck, str(CHART), "-n", ns, "--create-namespace", "--set", "image.repository=localhost/absent",
         "--set-string", "image.tag=none", "--set", "uninstallHook.activeDeadlineSeconds=10", binary="helm3")
    manifests = [d for d in yaml.safe_load_all(helm(cp, "get", "manifest", stuck, "-n", ns, binary="helm3")) if d]
    # Helm's message: "job <name> failed: DeadlineExceeded" (helm.sh/helm/v3 pkg/kube/client.go)
    with pytest.raises(RuntimeError, match=r"unregister failed: DeadlineExceeded") as failed:
        helm(cp, "uninstall", stuck, "-n", ns, "--wait", timeout=300, binary="helm3")
    reason = next(line for line in str(failed.value).splitlines() if "DeadlineExceeded" in line)
    assert cp.kubectl("get", "mutatingwebhookconfiguration", f"{stuck}-kubevirt-eviction-guard",
                      check=False).returncode == 0  # nothing was deleted: the release is still whole
    helm(cp, "uninstall", stuck, "-n", ns, "--wait", "--no-hooks", timeout=300, binary="helm3")
    left = leftovers(cp, stuck, ns, manifests)
    assert left == [], left
    detail["detail"] = (f"on the real node: {describe(h3)}; the hook's Job, ServiceAccount, ClusterRole and "
                        f"ClusterRoleBinding deleted after it; a hook Job that cannot run (image not pullable, "
                        f"activeDeadlineSeconds 10): uninstall failed ({reason.strip()[:120]!r}), "
                        "then --no-hooks removed the release and left nothing")


def test_a_killed_sessions_node_is_reaped(node):
    """A node whose test process is gone (its record names a dead owner) is torn down by the next start: its
    processes (found by cgroup), cgroups, network namespace, veth and folder. A running session's is left alone."""
    ident = "reap" + os.urandom(2).hex()
    netns, host_if, cgroup = f"kveg-{ident}", f"kvh{ident}", f"kveg-e2e-{ident}"
    workdir = node.dir.parent / f"stale-{ident}"
    workdir.mkdir()
    subprocess.run(["ip", "netns", "add", netns], check=True)
    subprocess.run(["ip", "link", "add", host_if, "type", "veth", "peer", "name", "kvn0", "netns", netns], check=True)
    procs = " ".join(str(h / cgroup / "cgroup.procs") for h in _cgroup_hierarchies())
    for h in _cgroup_hierarchies():
        (h / cgroup).mkdir()
        if (h / "cpuset.cpus").exists():
            for f in ("cpuset.cpus", "cpuset.mems"):
                (h / cgroup / f).write_text((h / f).read_text())
    sleeper = subprocess.Popen(["sh", "-c", f'for f in {procs}; do echo $$ > "$f"; done; exec sleep 600'],
                               start_new_session=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    record = NODES_DIR / f"{ident}.json"
    record.write_text(json.dumps({"id": ident, "netns": netns, "host_if": host_if, "cgroup": cgroup,
                                  "workdir": str(workdir), "owner": gone.pid, "owner_start": "1", "holder": None}))
    eventually(lambda: sleeper.pid in {int(p) for p in (_cgroup_hierarchies()[0] / cgroup / "cgroup.procs")
                                       .read_text().split()}, 10, "the stale node's process in its cgroup", every=0.1)
    try:
        reaped = reap_stale_nodes()
        assert [r["id"] for r in reaped] == [ident]  # this session's own node (its owner alive) is not reaped
        assert sleeper.wait(10) == -signal.SIGKILL
        assert not record.exists() and not workdir.exists()
        assert netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert subprocess.run(["ip", "link", "show", host_if], capture_output=True).returncode != 0
        assert not [h for h in _cgroup_hierarchies() if (h / cgroup).exists()]
        assert node.record.exists() and process_start(os.getpid()) is not None
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        record.unlink(missing_ok=True)
