"""One real Kubernetes node for the end-to-end tests, in a network namespace of its own.

containerd, runc and the CNI bridge plugin come from Debian's packages (``ensure_debian_packages``, as ``.ci/run``
installs Prometheus); kubelet, kube-scheduler, kube-controller-manager and kube-proxy from the pin in ``e2e/go.mod``
(``e2e/build.sh``); the pause image from Kubernetes' own ``build/pause/linux/pause.c`` of that pin, compiled here.
For these checks the whole cluster runs in the node's namespace: etcd and kube-apiserver too (``ControlPlane`` with
``address`` and ``prefix``), so the API server reaches the pods (webhook calls through the Service's endpoints) and
the pods reach it (the ``kubernetes`` Service's ClusterIP, by kube-proxy) without any route in this machine's own
namespace.

Isolation by construction, not by rules:

- the network namespace has no default route and one link out: a veth pair whose two ends (a /30 of 198.18.0.0/15,
  the range set aside for benchmark tests, checked free here) are the test's; the pod range sits on the namespace's
  bridge, the service range on a blackhole route inside it, so a packet to either can only stay inside. The test reaches
  the API server over the veth pair;
- kubelet finds the machine-wide sysctls it wants in place (``KUBELET_SYSCTLS``, bind mounts in its mount
  namespace) and, with ``protectKernelDefaults``, never writes them;
- every daemon runs in one mount namespace (an ``unshare`` holder process entered by ``nsenter``), with fresh
  tmpfs over ``/run``, ``/var/lib`` and ``/var/log``: containerd's and kubelet's state, the CNI plugins'
  ``/var/lib/cni``, pod logs and the pods' network namespaces live and die there (kubelet's volume mounts too);
- the holder (and so every daemon, shim and container) starts in cgroups of the test's own (``/kveg-e2e-<id>`` in
  each cgroup v1 hierarchy), which kubelet also uses as its ``cgroupRoot``: the pods' cgroups sit under it.

``stop`` ends the daemons by PID (SIGTERM, then SIGKILL to every process left in the test's cgroups), removes the
cgroups and the namespace and checks that nothing remains: no cgroup, no interface, no mount, ``ip_forward`` as it
was (``leftovers``).

A test process killed outright (SIGKILL, or SIGTERM, which runs no teardown; Ctrl-C does run it) leaves its node
running. Each node therefore writes a record (``build/e2e/nodes/<id>.json``: its netns, veth, cgroups, folder and
the PID and start time of the test process that owns it) before making anything, and removes it in ``stop``; the
next ``start`` in the same checkout reaps every node whose owner is gone (``reap_stale_nodes``): by the record's
names, never by a pattern, so that another checkout's or a running session's node is never touched.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from tests.e2e.controlplane import BIN, ROOT, ControlPlane, _Process, free_port, write_kubeconfig

DEBIAN_PACKAGES = {"containerd": "containerd", "runc": "runc", "/usr/lib/cni/bridge": "containernetworking-plugins",
                   "iptables": "iptables", "umoci": "umoci", "gcc": "gcc", "nsenter": "util-linux",
                   "/usr/lib/x86_64-linux-gnu/libc.a": "libc6-dev"}
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-controller-manager", "kube-proxy")
CGROUP = Path("/sys/fs/cgroup")
NODES_DIR = ROOT / "build" / "e2e" / "nodes"  # a record of each running node of this checkout
IMAGE_ARCHIVE = ROOT / "build" / "image" / "kubevirt-eviction-guard.oci.tar"
IMAGE_REPOSITORY = "localhost/kubevirt-eviction-guard"
PAUSE_REPOSITORY = "localhost/pause"
SERVICE_CIDR = "10.96.0.0/16"  # ControlPlane's --service-cluster-ip-range
# Machine-wide sysctls kubelet wants (k8s.io/kubernetes pkg/kubelet/cm setupKernelTunables): it would write them
# (protectKernelDefaults false) or refuse to start (true). Inside the node's mount namespace each path is a bind mount
# of a file saying what kubelet wants, and protectKernelDefaults is true: kubelet reads, finds, never writes.
KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                   "kernel/keys/root_maxbytes": "25000000"}
# what the session's node was (versions, start time, what it left behind): build/e2e/summary.json's "node"
NODE_INFO: dict = {}


def ensure_debian_packages() -> None:
    """apt-get install what the node needs, when it is missing (root, Debian; ``apt-get update`` once if needed)."""
    missing = sorted({pkg for path, pkg in DEBIAN_PACKAGES.items()
                      if not (os.path.exists(path) if path.startswith("/") else shutil.which(path))})
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=True)
        subprocess.run(cmd, env=env, capture_output=True, check=True)


def run(*cmd: str, check: bool = True, timeout: float = 120, input: str | None = None) -> str:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=input)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}: {out.stdout}{out.stderr}")
    return out.stdout


def _routes() -> list[ipaddress.IPv4Network]:
    nets = []
    for r in json.loads(run("ip", "-j", "-4", "route", "show", "table", "all")):
        dst = r.get("dst", "")
        if dst and dst != "default":
            try:
                nets.append(ipaddress.ip_network(dst, strict=False))
            except ValueError:
                pass
    return nets


def _free_subnet(prefix: int, used: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    pool = list(ipaddress.ip_network("198.18.0.0/15").subnets(new_prefix=prefix))
    random.shuffle(pool)
    for net in pool:
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free subnet of 198.18.0.0/15 on this machine")


def _cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies (and the unified one), each a directory the test makes its cgroup in."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, mnt, fstype, *_ = line.split()
        if fstype in ("cgroup", "cgroup2") and Path(mnt).is_relative_to(CGROUP):
            out.append(Path(mnt))
    return out


def kernel_state() -> dict:
    """What the node must leave as it found: interfaces, network namespaces, ip_forward, mounts of the places kubelet,
    containerd and CNI use by default."""
    return {
        "links": sorted(link["ifname"] for link in json.loads(run("ip", "-j", "link", "show"))),
        "netns": sorted(line.split()[0] for line in run("ip", "netns", "list").splitlines() if line.strip()),
        "ip_forward": Path("/proc/sys/net/ipv4/ip_forward").read_text().strip(),
        "sysctls": {k: Path(f"/proc/sys/{k}").read_text().strip() for k in KUBELET_SYSCTLS},
        "paths": sorted(p for p in ("/var/lib/kubelet", "/var/lib/cni", "/var/lib/containerd", "/run/containerd",
                                    "/var/log/pods", "/var/log/containers", "/etc/cni/net.d") if os.path.exists(p)),
        "mounts": sorted(line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
                         if "kveg-" in line or "/kubelet" in line or "containerd" in line),
    }


def build_pause(out_dir: Path) -> Path:
    """The pause image (an OCI archive) from Kubernetes' own ``build/pause/linux/pause.c`` of the pinned module,
    compiled statically with Debian's gcc, as Kubernetes' build does."""
    version = _k8s_version()
    modcache = run("go", "env", "GOMODCACHE").strip()
    src = Path(modcache) / f"k8s.io/kubernetes@{version}" / "build/pause/linux/pause.c"
    if not src.exists():  # the module is in the cache once e2e/build.sh has run
        raise RuntimeError(f"{src} missing: run bash e2e/build.sh first")
    archive = out_dir / "pause.oci.tar"
    work = out_dir / "pause-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    run("gcc", "-Os", "-Wall", "-Werror", "-static", "-DVERSION=" + version, "-o", str(work / "pause"), str(src))
    layout = f"{work}/oci"
    run("umoci", "init", "--layout", layout)
    run("umoci", "new", "--image", f"{layout}:{version}")
    run("umoci", "unpack", "--image", f"{layout}:{version}", f"{work}/bundle")
    shutil.copy(work / "pause", work / "bundle" / "rootfs" / "pause")
    run("umoci", "repack", "--image", f"{layout}:{version}", f"{work}/bundle")
    run("umoci", "config", "--image", f"{layout}:{version}", "--config.entrypoint", "/pause",
        "--config.user", "65535:65535")
    run("tar", "-C", layout, "-cf", str(archive), ".")
    shutil.rmtree(work)
    return archive


def _k8s_version() -> str:
    out = subprocess.run(["go", "list", "-m", "-f", "{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}",
                          "k8s.io/kubernetes"], cwd=ROOT / "e2e", capture_output=True, text=True, check=True,
                         env={**os.environ, "GOFLAGS": "-mod=readonly", "GOSUMDB": "off"})
    return out.stdout.strip()


def versions(bin_dir: Path = BIN) -> dict:
    """What kubelet, containerd and runc say of themselves."""
    def first(*cmd: str) -> str:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    return {"kubelet": first(str(bin_dir / "kubelet"), "--version"), "containerd": first("containerd", "--version"),
            "runc": first("runc", "--version"),
            "cni_bridge": first("dpkg-query", "-W", "-f", "containernetworking-plugins ${Version}",
                                "containernetworking-plugins")}


def process_start(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot), which a reused PID does not share; None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _kill_cgroup(cgroup_name: str, others: Callable[[], set[int]] = set, reap: Callable[[], None] = lambda: None
                 ) -> None:
    """SIGKILL to every process in the test's cgroups and in ``others()``, until none is left (``reap`` after each
    round waits for this process's own children among them); then the cgroups go."""
    for _ in range(50):
        pids = _cgroup_pids(cgroup_name) | others()
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        reap()
        time.sleep(0.2)
    for h in _cgroup_hierarchies():
        root = h / cgroup_name
        if root.exists():
            for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                _rmdir(d)
            _rmdir(root)


def _cgroup_pids(cgroup_name: str) -> set[int]:
    pids: set[int] = set()
    for h in _cgroup_hierarchies():
        root = h / cgroup_name
        if root.exists():
            for procs in root.rglob("cgroup.procs"):
                try:
                    pids |= {int(p) for p in procs.read_text().split()}
                except OSError:
                    pass
    return pids


def reap_stale_nodes(records: Path = NODES_DIR) -> list[dict]:
    """Tear down the nodes of this checkout whose test process is gone (killed without its teardown): every process
    in their cgroups, the cgroups, the network namespace, the veth's host end, the node's folder. Returns the
    records reaped."""
    reaped = []
    for path in sorted(records.glob("*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written by a node starting right now
        if process_start(rec["owner"]) == rec["owner_start"]:
            continue  # its session is still running
        holder = {rec["holder"]} if rec.get("holder") and process_start(rec["holder"]) == rec.get("holder_start") \
            else set()
        _kill_cgroup(rec["cgroup"], lambda: {p for p in holder if process_start(p) is not None})
        subprocess.run(["ip", "netns", "del", rec["netns"]], capture_output=True)
        subprocess.run(["ip", "link", "del", rec["host_if"]], capture_output=True)
        shutil.rmtree(rec["workdir"], ignore_errors=True)
        path.unlink(missing_ok=True)
        reaped.append(rec)
    return reaped


class Node:
    """The node and the control plane it belongs to, in ``workdir``; ``start()`` returns when the node is Ready."""

    NAME = "kveg-node"

    def __init__(self, workdir: Path, bin_dir: Path = BIN) -> None:
        self.dir = workdir
        self.bin = bin_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.id = uuid.uuid4().hex[:8]
        self.netns = f"kveg-{self.id}"
        self.host_if, self.node_if = f"kvh{self.id[:8]}", "kvn0"
        used = _routes()
        link = _free_subnet(30, used)
        self.host_ip, self.node_ip = (str(h) for h in link.hosts())
        self.link = link
        self.pod_cidr = str(_free_subnet(24, used + [link]))
        self.cgroup_name = f"kveg-e2e-{self.id}"
        self.before = kernel_state()
        self.holder: subprocess.Popen | None = None
        self.mount_ns = ""
        self.processes: list[_Process] = []
        self.cp: ControlPlane | None = None
        self.reaped: list[dict] = []  # nodes of killed sessions torn down by start()

    # ---- namespaces ----

    def _setup_network(self) -> None:
        ns = self.netns
        run("ip", "netns", "add", ns)
        run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.node_if, "netns", ns)
        run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        run("ip", "link", "set", self.host_if, "up")
        inside = ["ip", "netns", "exec", ns]
        run(*inside, "ip", "addr", "add", f"{self.node_ip}/30", "dev", self.node_if)
        run(*inside, "ip", "link", "set", self.node_if, "up")
        run(*inside, "ip", "link", "set", "lo", "up")
        # the service range leads nowhere (a blackhole route): kube-proxy's DNAT rewrites what it serves first
        run(*inside, "ip", "route", "add", "blackhole", SERVICE_CIDR)

    def _setup_cgroups(self) -> None:
        for h in _cgroup_hierarchies():
            (h / self.cgroup_name).mkdir(exist_ok=True)
            if (h / "cpuset.cpus").exists():  # a v1 cpuset cgroup starts empty: give it its parent's
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (h / self.cgroup_name / f).write_text((h / f).read_text())

    def _start_holder(self) -> None:
        """The process whose network and mount namespaces every daemon enters; it joins the test's cgroups first."""
        script = (
            f"for h in {' '.join(str(h / self.cgroup_name) for h in _cgroup_hierarchies())}; do "
            "echo $$ > $h/cgroup.procs; done; "
            "mount -t tmpfs -o mode=755 kveg-run /run && mkdir -p /run/netns && "
            "mount -t tmpfs -o mode=755 kveg-varlib /var/lib && mount -t tmpfs -o mode=755 kveg-varlog /var/log && "
            "mkdir /run/kveg-sysctl && "
            + "".join(f"echo {v} > /run/kveg-sysctl/{k.replace('/', '.')} && "
                      f"mount --bind /run/kveg-sysctl/{k.replace('/', '.')} /proc/sys/{k} && "
                      for k, v in KUBELET_SYSCTLS.items())
            + "echo ready && exec sleep infinity"
        )
        self.holder = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{self.netns}", "unshare", "--mount", "--propagation", "slave",
             "sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        line = self.holder.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError(f"namespace holder failed: {line} {self.holder.stderr.read()}")
        self.mount_ns = os.readlink(f"/proc/{self.holder.pid}/ns/mnt")

    def inside(self) -> list[str]:
        """A command prefix: into the holder's network and mount namespaces and the test's cgroups (so that what
        the command starts, containerd's shims included, which leave their parent, stays where ``stop`` finds it)."""
        assert self.holder is not None
        procs = " ".join(str(h / self.cgroup_name / "cgroup.procs") for h in _cgroup_hierarchies())
        return ["nsenter", "-t", str(self.holder.pid), "--net", "--mount", "--",
                "sh", "-c", f'for f in {procs}; do echo $$ > "$f"; done; exec "$@"', "sh"]

    def _daemon(self, name: str, cmd: list[str]) -> _Process:
        p = _Process(name, [*self.inside(), *cmd], self.dir / f"{name}.log")
        p.start()
        self.processes.append(p)
        return p

    # ---- start ----

    @property
    def record(self) -> Path:
        return NODES_DIR / f"{self.id}.json"

    def _write_record(self) -> None:
        NODES_DIR.mkdir(parents=True, exist_ok=True)
        holder = self.holder.pid if self.holder is not None else None
        rec = {"id": self.id, "netns": self.netns, "host_if": self.host_if, "cgroup": self.cgroup_name,
               "workdir": str(self.dir), "owner": os.getpid(), "owner_start": process_start(os.getpid()),
               "holder": holder, "holder_start": process_start(holder) if holder else None}
        tmp = self.record.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec))
        tmp.replace(self.record)

    def start(self, timeout: float = 300) -> "Node":
        ensure_debian_packages()
        self.reaped = reap_stale_nodes()
        if self.reaped:  # what they left is not this node's: compare with the state after them
            self.before = kernel_state()
        self._write_record()
        try:
            self._setup_network()
            self._setup_cgroups()
            self._start_holder()
            self._write_record()
            self.cp = ControlPlane(self.dir / "control-plane", self.bin, address=self.node_ip, prefix=self.inside(),
                                   for_node=True)
            self.cp.start()
            self._start_containerd()
            self.import_image(build_pause(self.dir), PAUSE_REPOSITORY)
            self._start_kubelet()
            self._start_components()
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def ctr(self, *args: str, timeout: float = 300) -> str:
        return run(*self.inside(), "ctr", "--address", "/run/containerd/containerd.sock", "-n", "k8s.io", *args,
                   timeout=timeout)

    def import_image(self, archive: Path, repository: str) -> list[str]:
        """``ctr images import`` of an OCI archive whose tags are bare tags: imported as REPOSITORY:TAG."""
        self.ctr("images", "import", "--base-name", repository, str(archive))
        return [line.split()[0] for line in self.ctr("images", "ls").splitlines()[1:] if line.startswith(repository)]

    def _start_containerd(self) -> None:
        (self.dir / "net.d").mkdir(exist_ok=True)
        (self.dir / "net.d" / "10-kveg.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "kveg",
            "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
                         "ipam": {"type": "host-local", "ranges": [[{"subnet": self.pod_cidr}]],
                                  "routes": [{"dst": "0.0.0.0/0"}]}}],
        }))
        pause = f"{PAUSE_REPOSITORY}:{_k8s_version()}"
        config = f"""version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.grpc.v1.cri.restart", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{self.dir / 'net.d'}"
"""
        (self.dir / "containerd.toml").write_text(config)
        p = self._daemon("containerd", ["containerd", "--config", str(self.dir / "containerd.toml")])
        self._wait(lambda: subprocess.run([*self.inside(), "ctr", "--address", "/run/containerd/containerd.sock",
                                           "version"], capture_output=True).returncode == 0, p, 60)

    def _issue(self, name: str, cn: str, org: str | None = None) -> Path:
        assert self.cp is not None
        cert, key = self.cp.ca.issue(cn, org=org)
        (self.dir / f"{name}.crt").write_bytes(cert)
        (self.dir / f"{name}.key").write_bytes(key)
        (self.dir / f"{name}.key").chmod(0o600)
        return write_kubeconfig(self.dir / f"{name}.kubeconfig", self.cp.url, self.cp.ca_path,
                                cert=self.dir / f"{name}.crt", key=self.dir / f"{name}.key", user=cn)

    def _start_kubelet(self) -> None:
        assert self.cp is not None
        kubeconfig = self._issue("kubelet", f"system:node:{self.NAME}", "system:nodes")
        (self.dir / "resolv.conf").write_text("")
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{self.cgroup_name}",
            "failSwapOn": False, "protectKernelDefaults": True, "address": self.node_ip, "port": free_port(), "readOnlyPort": 0,
            "healthzPort": 0, "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cp.ca_path)}},
            "authorization": {"mode": "Webhook"},
            "resolvConf": str(self.dir / "resolv.conf"), "clusterDomain": "cluster.local",
            "rotateCertificates": False, "serializeImagePulls": False,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "nodeStatusUpdateFrequency": "2s", "syncFrequency": "5s",
            "localStorageCapacityIsolation": True,
        }
        (self.dir / "kubelet.yaml").write_text(json.dumps(config, indent=1))
        self._daemon("kubelet", [
            str(self.bin / "kubelet"), "--config", str(self.dir / "kubelet.yaml"), "--kubeconfig", str(kubeconfig),
            "--hostname-override", self.NAME, "--node-ip", self.node_ip, "--root-dir", "/var/lib/kubelet",
            "--v", "2",
        ])

    def _start_components(self) -> None:
        assert self.cp is not None
        scheduler = self._issue("scheduler", "system:kube-scheduler")
        self._daemon("kube-scheduler", [
            str(self.bin / "kube-scheduler"), "--kubeconfig", str(scheduler), "--authentication-kubeconfig",
            str(scheduler), "--authorization-kubeconfig", str(scheduler), "--leader-elect=false",
            "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
        ])
        cm = self._issue("controller-manager", "system:kube-controller-manager")
        self._daemon("kube-controller-manager", [
            str(self.bin / "kube-controller-manager"), "--kubeconfig", str(cm), "--authentication-kubeconfig",
            str(cm), "--authorization-kubeconfig", str(cm), "--leader-elect=false",
            "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
            "--use-service-account-credentials=true",
            "--service-account-private-key-file", str(self.cp.dir / "sa.key"),
            "--root-ca-file", str(self.cp.ca_path), "--cluster-name", "kveg",
            "--node-monitor-grace-period", "40s",
        ])
        proxy = self._issue("kube-proxy", "system:kube-proxy")
        (self.dir / "kube-proxy.yaml").write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "mode": "iptables", "clusterCIDR": self.pod_cidr, "hostnameOverride": self.NAME,
            "bindAddress": self.node_ip, "clientConnection": {"kubeconfig": str(proxy)},
            "healthzBindAddress": f"127.0.0.1:{free_port()}", "metricsBindAddress": f"127.0.0.1:{free_port()}",
            # never touch the conntrack table's global limits and timeouts: this machine's, not the node's
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s",
                          "udpTimeout": "0s", "udpStreamTimeout": "0s"},
            "nodePortAddresses": [f"{self.node_ip}/32"],
        }, indent=1))
        self._daemon("kube-proxy", [str(self.bin / "kube-proxy"), "--config", str(self.dir / "kube-proxy.yaml")])

    def _wait(self, check, proc: _Process, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
            if check():
                return
            time.sleep(0.5)
        raise TimeoutError(f"{proc.name}: not ready in {timeout:.0f} s:\n{proc.tail()}")

    def _wait_ready(self, timeout: float) -> None:
        assert self.cp is not None
        kubelet = next(p for p in self.processes if p.name == "kubelet")

        def ready() -> bool:
            for p in self.processes:
                if not p.alive():
                    raise RuntimeError(f"{p.name} exited:\n{p.tail()}")
            out = self.cp.kubectl("get", "node", self.NAME, "-o", "json", check=False)
            if out.returncode != 0:
                return False
            conds = {c["type"]: c["status"] for c in json.loads(out.stdout)["status"].get("conditions", [])}
            return conds.get("Ready") == "True"
        self._wait(ready, kubelet, timeout)

    # ---- the node's processes ----

    def cgroup_pids(self) -> set[int]:
        return _cgroup_pids(self.cgroup_name)

    def container_pids(self, command: str) -> list[int]:
        """PIDs of processes in the pods' cgroups whose command line contains ``command``."""
        out = []
        for pid in self.cgroup_pids():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                cg = Path(f"/proc/{pid}/cgroup").read_text()
            except OSError:
                continue
            if command in cmdline and "/kubepods" in cg:
                out.append(pid)
        return sorted(out)

    # ---- stop ----

    def stop(self) -> None:
        for p in reversed(self.processes):
            if p.name != "containerd":
                p.stop(timeout=20)
        if self.cp is not None:
            self.cp.stop()
        for p in self.processes:
            if p.name == "containerd":
                p.stop(timeout=20)
        # whatever is left in the test's cgroups (shims, containers), its mount namespace and the holder, by PID
        _kill_cgroup(self.cgroup_name, self._namespace_pids, self._reap_holder)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        self.record.unlink(missing_ok=True)

    def leftovers(self) -> dict:
        """What differs from before ``start`` (empty: nothing left), and the test's cgroups if any remain."""
        after, before = kernel_state(), dict(self.before)
        # other sessions' nodes (other checkouts run theirs at the same time) come and go: not this node's doing
        for k in ("links", "netns", "mounts"):
            before[k], after[k] = self._not_others(before[k]), self._not_others(after[k])
        diff = {k: {"before": before[k], "after": after[k]} for k in after if after[k] != before[k]}
        cgroups = [str(h / self.cgroup_name) for h in _cgroup_hierarchies() if (h / self.cgroup_name).exists()]
        if cgroups:
            diff["cgroups"] = cgroups
        if self.mount_ns and (procs := self._in_mount_ns()):
            diff["processes"] = procs
        return diff

    def _not_others(self, entries: list[str]) -> list[str]:
        """``entries`` without another node's netns, veth or netns mount (and ``ip netns list``'s "(id: N)")."""
        out = []
        for e in entries:
            m = re.search(r"kveg-([0-9a-z]{8})\b|^kvh([0-9a-z]{8})$", e)
            if (m and self.id not in m.groups()) or re.fullmatch(r"\(id:|\d+\)", e):
                continue
            out.append(e)
        return out

    def _namespace_pids(self) -> set[int]:
        """The processes in the node's mount namespace and the namespace holder, while it runs."""
        pids = {int(p.split()[0]) for p in (self._in_mount_ns() if self.mount_ns else [])}
        if self.holder is not None and self.holder.poll() is None:
            pids.add(self.holder.pid)
        return pids

    def _reap_holder(self) -> None:
        if self.holder is not None:
            try:
                self.holder.wait(0.1)
            except subprocess.TimeoutExpired:
                pass

    def _in_mount_ns(self) -> list[str]:
        """Processes still in the node's mount namespace (whatever their cgroup)."""
        out = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{pid}/ns/mnt") == self.mount_ns:
                    out.append(f"{pid} {Path(f'/proc/{pid}/comm').read_text().strip()}")
            except OSError:
                pass
        return out


# the names a node gives its network namespace, its veth end and their mounts (``Node.netns``, ``Node.host_if``)


def _rmdir(path: Path) -> None:
    for _ in range(20):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
