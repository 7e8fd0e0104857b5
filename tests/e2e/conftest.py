"""End-to-end tests against the real kube-apiserver, etcd, Helm and descheduler (marker ``e2e``; ``make e2e``).

``make test`` never collects them (``-m 'not e2e'``). ``make e2e`` builds the pinned binaries first
(``e2e/build.sh``); run here without them, every test fails with the command that builds them, never a silent skip.

Each named check (``@pytest.mark.check("...")``) is recorded in ``build/e2e/summary.json`` with whether it passed
and a detail line, beside the paths and versions of the binaries used and the outcome run's figures
(``build/e2e/outcome.json``, written by the outcome test).

Groups (``e2e_group``): a test belongs to the group of the session-wide resource its fixtures start (the real node:
``node`` or ``image``; real KubeVirt's control plane: ``real_kubevirt``; the shared control plane: ``control_plane``),
and a test using none of them (it starts what it needs itself) to its file's group. ``--e2e-group NAME`` runs one
group; ``make e2e`` runs the groups side by side, each in a pytest process of its own (``tests/e2e/groups.py``), so a
session fixture starts only in the process whose tests use it. The summary has each group's wall time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster
from tests.e2e.controlplane import BIN, ROOT, ControlPlane, binary_version, missing_binaries
from tests.e2e.guard import GuardProcess, Installation, fullname, install_chart
from tests.e2e.kubevirt import KubeVirt, RealKubeVirtCluster
from tests.e2e.kubevirt import missing_binaries as missing_kubevirt
from tests.e2e.virtapi import VirtApi

SUMMARY = Path(os.environ.get("E2E_SUMMARY") or ROOT / "build" / "e2e" / "summary.json")
OUTCOME = SUMMARY.with_name("outcome.json")
_checks: dict[str, dict] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "check(name): a named end-to-end check, recorded in build/e2e/summary.json")


# The session-wide resources tests share, each with the fixtures that start it; a test using several is in the first.
SHARED = (("node", {"node", "image"}), ("kubevirt", {"real_kubevirt"}), ("control-plane", {"control_plane"}))
# the pytest-timeout of a test that sets none (make test's is 120 s): the groups share the machine's CPU, and what
# an end-to-end test waits for (API servers, kubelet, KubeVirt) slows down with it
E2E_TIMEOUT = 600
_groups: dict[str, dict] = {}  # group -> its first test's start, its last test's end, tests, failed reports


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--e2e-group", action="append", default=[], metavar="NAME",
                     help="run only the end-to-end tests of this group (repeatable)")
    parser.addoption("--e2e-groups-out", metavar="PATH",
                     help="write the end-to-end groups and their tests (JSON) to PATH (with --collect-only)")


def e2e_group(item: pytest.Item) -> str:
    """The group a test runs in: the shared resource its fixtures start, else its file's own."""
    fixtures = set(getattr(item, "fixturenames", ()))
    for group, starts in SHARED:
        if fixtures & starts:
            return group
    return Path(str(item.fspath)).stem


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    only = set(config.getoption("--e2e-group"))
    keep, drop = [], []
    for item in items:
        if not Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            keep.append(item)
            continue
        item.add_marker(pytest.mark.e2e)
        if item.get_closest_marker("timeout") is None:  # a guard against hangs, not a bound on a busy machine's pace
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT))
        group = e2e_group(item)
        item.user_properties.append(("e2e_group", group))
        (keep if not only or group in only else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_finish(session: pytest.Session) -> None:
    """``--e2e-groups-out``: the groups of the tests selected (after -m, -k and --e2e-group)."""
    out = session.config.getoption("--e2e-groups-out")
    if out:
        groups: dict[str, list[str]] = {}
        for item in session.items:
            group = dict(item.user_properties).get("e2e_group")
            if group is not None:
                groups.setdefault(group, []).append(item.nodeid)
        Path(out).write_text(json.dumps(groups, indent=2) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    group = dict(report.user_properties).get("e2e_group")
    if group is None:
        return
    g = _groups.setdefault(group, {"start": report.start, "stop": report.stop, "tests": set(), "failed": 0})
    g["start"], g["stop"] = min(g["start"], report.start), max(g["stop"], report.stop)
    g["tests"].add(report.nodeid)
    g["failed"] += report.failed


def group_times() -> dict[str, dict]:
    """Each group's wall time, from its first test's set-up to its last test's tear-down."""
    return {name: {"seconds": round(g["stop"] - g["start"], 1), "tests": len(g["tests"]), "passed": not g["failed"]}
            for name, g in _groups.items()}


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _groups:
        return
    terminalreporter.section("end-to-end groups (wall time)")
    for name, g in sorted(group_times().items(), key=lambda kv: -kv[1]["seconds"]):
        terminalreporter.write_line(f"{name:<26} {g['seconds']:7.1f} s  {g['tests']:3d} tests"
                                    f"{'' if g['passed'] else '  FAILED'}")


@pytest.fixture(scope="session")
def binaries() -> Path:
    missing = missing_binaries()
    if missing:
        pytest.fail(f"e2e binaries missing in {BIN}: {', '.join(missing)}; build them with `make e2e` "
                    "(or make e2e-bin)", pytrace=False)
    return BIN


@pytest.fixture(scope="session")
def e2e_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix=f"kveg-e2e-{os.environ.get('E2E_PART', 'session')}-"))
    yield d
    if os.environ.get("E2E_KEEP") != "1":
        shutil.rmtree(d, ignore_errors=True)


# The release of the client-certificate check (tests/e2e/test_client_ca.py): the session's API server presents a
# client certificate to its webhook's Service host, configured as docs/install.md tells users (before the release
# exists, as the docs' order is: the API servers first, then clientCA).
MTLS_RELEASE, MTLS_NAMESPACE = "guard-mtls", "kveg-mtls"
MTLS_WEBHOOK_HOST = f"{fullname(MTLS_RELEASE, {})}.{MTLS_NAMESPACE}.svc"


@pytest.fixture(scope="session")
def control_plane(binaries: Path, e2e_dir: Path) -> Iterator[ControlPlane]:
    cp = ControlPlane(e2e_dir / "control-plane", binaries, webhook_client_hosts=(MTLS_WEBHOOK_HOST,)).start()
    try:
        cp.install_crds()
        yield cp
    finally:
        cp.stop()


# The chart values every test shares: the canceller on, so that its evacuate/cancel rule is rendered and exercised.
CHART_VALUES = {"cancelStuckEvacuations": {"enabled": True}}


@pytest.fixture(scope="session")
def installation(control_plane: ControlPlane, e2e_dir: Path) -> Installation:
    """The chart, installed once per session by ``helm install`` (tests/e2e/guard.py).

    The control plane serves KubeDescheduler (its CRD), as OpenShift with the descheduler operator does, and the
    operator's namespace exists before the install, as it does there: the chart's ``deschedulerCheck.createRole:
    auto`` then grants the namespaced Role, and the guard's reads of it pass the authorizer."""
    if control_plane.kubectl("get", "namespace", DESCHEDULER_NAMESPACE, check=False).returncode != 0:
        control_plane.kubectl("create", "namespace", DESCHEDULER_NAMESPACE)
    return install_chart(control_plane, e2e_dir / "chart", values=CHART_VALUES)


DESCHEDULER_NAMESPACE = "openshift-kube-descheduler-operator"

# Beside the chart's args, only what makes the session quicker without changing which calls the guard makes: Events
# aggregated every 2 s instead of every minute, stuck evacuations looked for every 2 s instead of 30 s.
GUARD_ARGS = ("--event-interval=2s", "--cancel-interval=2s")


@pytest.fixture(scope="session")
def virt_api(control_plane: ControlPlane, e2e_dir: Path) -> Iterator[VirtApi]:
    """KubeVirt's aggregated API ``subresources.kubevirt.io`` served by the virt-api stand-in (tests/e2e/virtapi.py),
    Available before the guard starts, as KubeVirt is installed before the guard: the guard's canceller finds
    ``evacuate/cancel`` served and allowed, and turns on."""
    api = VirtApi(control_plane, e2e_dir / "virt-api").start()
    try:
        yield api
    finally:
        api.stop()


@pytest.fixture(scope="session")
def guard(installation: Installation, virt_api: VirtApi) -> Iterator[GuardProcess]:
    """The guard as a local process with the chart's args, config and ServiceAccount token; ready (every kind listed)."""
    g = GuardProcess(installation, GUARD_ARGS).start()
    try:
        yield g
    finally:
        g.stop()


@pytest.fixture
def detail(request: pytest.FixtureRequest) -> dict:
    """A test's check detail: whatever it sets under ``detail["detail"]`` goes into the summary."""
    d: dict = {}
    request.node._e2e_detail = d
    return d


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("check")
    if marker is None or not (report.when == "call" or report.failed):
        return
    if report.passed:
        detail = getattr(item, "_e2e_detail", {}).get("detail") or item.nodeid
    else:
        last = str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""
        detail = f"{item.name}: {report.when} failed: {last}"[:500]
    name = marker.args[0]
    prev = _checks.get(name)  # several tests may share a check: it passes only if all of them pass
    _checks[name] = {"name": name, "passed": report.passed and (prev is None or prev["passed"]),
                     "detail": detail if prev is None else f"{prev['detail']}; {detail}"}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _checks:  # not an e2e session
        return
    summary: dict = {}
    for key, name in (("kube_apiserver", "kube-apiserver"), ("etcd", "etcd"), ("descheduler", "descheduler")):
        path = BIN / name
        summary[key] = {"path": str(path.resolve()), "version": binary_version(name) if path.exists() else None}
    summary["kubernetes"] = summary["kube_apiserver"]["version"]
    for key, name, module in (("helm", "helm", "helm.sh/helm/v4"), ("helm3", "helm3", "helm.sh/helm/v3")):
        path = BIN / name
        version = binary_version(name) if path.exists() else None
        summary[key] = {"how": f"helm CLI built from {module} ({version or '?'})", "version": version,
                        "path": str(path.resolve())}
    summary["kubevirt"] = KubeVirt.summary(BIN)
    summary["checks"] = list(_checks.values())
    summary["groups"] = group_times()
    if OUTCOME.exists():
        summary["outcome"] = json.loads(OUTCOME.read_text())
    from tests.e2e.node import NODE_INFO

    if NODE_INFO:  # tests/e2e/test_node.py ran: kubelet's, containerd's and runc's versions
        summary["node"] = NODE_INFO
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(summary, indent=2) + "\n")


@pytest.fixture(scope="session")
def cluster(control_plane: ControlPlane, guard: GuardProcess) -> Cluster:
    """Objects, evictions and the audit log of the control plane, synced against the session's guard."""
    return Cluster(control_plane, guard)


# ---- real KubeVirt (tests/e2e/kubevirt.py): a control plane of its own -------------------------------------------

# The chart's values on the real-KubeVirt control plane: the canceller on, and a descheduler-caused evacuation stuck
# after 2 failed attempts (KubeVirt's backoff makes that about 20 s of failures, not minutes).
REAL_CHART_VALUES = {"cancelStuckEvacuations": {"enabled": True}, "policy": {"evacuationStaleAfterFailures": 2}}


@pytest.fixture(scope="session")
def real_kubevirt(binaries: Path, e2e_dir: Path) -> Iterator[RealKubeVirtCluster]:
    """KubeVirt's own virt-api and virt-controller (built from the Go module proxy) installed as virt-operator would
    on a control plane of their own, the actor's kubelet, scheduler and virt-handler beside them, and the chart
    installed and its guard running there. A control plane of its own because real virt-api owns VMI status (it
    resets every status write by anyone but KubeVirt's ServiceAccounts) and real virt-controller acts on every VMIM:
    the hand-built states of the other checks cannot exist beside it."""
    missing = missing_kubevirt()
    if missing:
        pytest.fail(f"KubeVirt binaries missing in {BIN}: {', '.join(missing)}; build them with `make e2e-bin` "
                    "(or bash e2e/kubevirt/build.sh)", pytrace=False)
    # no kubernetes Service endpoint is reconciled: nothing here reaches the API server through the Service, and
    # Kubernetes 1.37 refuses a loopback advertise address for the endpoint reconciler
    cp = ControlPlane(e2e_dir / "kubevirt-control-plane", binaries,
                      extra_args=("--endpoint-reconciler-type=none",)).start()
    stack = RealKubeVirtCluster(cp, e2e_dir / "kubevirt")
    try:
        if cp.kubectl("get", "namespace", DESCHEDULER_NAMESPACE, check=False).returncode != 0:
            cp.kubectl("create", "namespace", DESCHEDULER_NAMESPACE)
        stack.start(chart_values=REAL_CHART_VALUES, guard_args=GUARD_ARGS)
        yield stack
    finally:
        stack.stop()
        cp.stop()
