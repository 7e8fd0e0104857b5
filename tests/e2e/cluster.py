"""What the eviction checks do to the control plane: make VMs, wait until the guard has seen them, evict.

Evictions are sent the ways real clients send them:

- ``evict`` uses the ``kubernetes`` Python client's ``create_namespaced_pod_eviction`` (``POST
  /api/v1/namespaces/NS/pods/NAME/eviction`` with a policy/v1 Eviction: what client-go's ``EvictV1`` sends, and
  what the descheduler sends with its ``requested-by`` and ``reason`` annotations when ``descheduler=True``);
- ``evict_raw`` posts the body kubectl's drain helper builds (k8s.io/kubectl/pkg/drain ``EvictPod``: name,
  namespace and ``deleteOptions``, ``dryRun: ["All"]`` under ``--dry-run=server``) over plain HTTPS;
- tests also run the built ``kubectl drain`` itself.

``sync`` is a barrier: each of the guard's four watches delivers events in resourceVersion order, so once a new
object of each kind shows up in the guard's ``cache_objects`` gauge, every write made before it has reached the
guard's store. Without it, a request could outrun the watch and be judged on the state before the test's writes.
"""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import dataclass

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.e2e.controlplane import ControlPlane
from tests.e2e.guard import GuardProcess
from tests.e2e.objects import KubeObjects
from tests.live_support import eventually

DESCHEDULER_ANNOTATIONS = {"requested-by": "sigs.k8s.io/descheduler",
                           "reason": "triggered by profile KubeVirtRelieveAndMigrate/LowNodeUtilization: e2e"}
BARRIER_NS = "e2e-barrier"


@dataclass
class VM:
    vmi: dict
    pod: dict

    @property
    def namespace(self) -> str:
        return self.pod["metadata"]["namespace"]

    @property
    def name(self) -> str:
        return self.vmi["metadata"]["name"]

    @property
    def pod_name(self) -> str:
        return self.pod["metadata"]["name"]


class Cluster:
    def __init__(self, cp: ControlPlane, guard: GuardProcess | None = None) -> None:
        self.cp = cp
        self.guard = guard
        self.api = cp.api_client()
        self.objects = KubeObjects(self.api)
        self.core = client.CoreV1Api(self.api)
        self._n = itertools.count(1)
        self._barrier_ready = False
        self.last_warnings: list[str] = []  # the Warning headers of the last evict_raw (what kubectl prints)

    # ---- names ----

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{next(self._n)}-{uuid.uuid4().hex[:4]}"

    def fresh_namespace(self, prefix: str = "vms", labels: dict | None = None) -> str:
        name = self.unique(prefix)
        self.objects.namespace(name, labels)
        return name

    def fresh_node(self, prefix: str = "worker", cordoned: bool = False) -> str:
        name = self.unique(prefix)
        self.objects.node(name, cordoned=cordoned)
        return name

    def vm(self, namespace: str, name: str, node: str, *, pod_annotations: dict | None = None, **vmi_kw) -> VM:
        """A VMI on ``node`` and its Ready launcher pod there."""
        vmi = self.objects.vmi(namespace, name, node, **vmi_kw)
        pod = self.objects.launcher_pod(namespace, vmi, node, annotations=pod_annotations)
        return VM(vmi, pod)

    # ---- the guard has seen it ----

    def sync(self, guard: GuardProcess | None = None, timeout: float = 15.0) -> None:
        """Wait until the guard's store holds every write made so far (a new object per kind; see the module doc)."""
        g = guard or self.guard
        assert g is not None, "sync needs the guard"
        if not self._barrier_ready:
            if self.cp.kubectl("get", "namespace", BARRIER_NS, check=False).returncode != 0:
                self.objects.namespace(BARRIER_NS)
            self._barrier_ready = True
        before = {k: g.metric("kubevirt_eviction_guard_cache_objects", kind=k) for k in ("vmi", "vmim", "pod", "node")}
        self.barrier_objects(self.unique("barrier"))
        for kind, n in before.items():
            eventually(lambda k=kind, n=n: g.metric("kubevirt_eviction_guard_cache_objects", kind=k) > n,
                       timeout, f"the guard's {kind} watch to catch up", every=0.05)

    def barrier_objects(self, tag: str) -> None:
        """One new object of each watched kind, named ``tag``."""
        self.objects.node(tag)
        vmi = self.objects.vmi(BARRIER_NS, tag, tag)
        self.objects.vmim(BARRIER_NS, tag, tag, "Succeeded")
        self.objects.launcher_pod(BARRIER_NS, vmi, tag, phase="Succeeded", ready=False)

    # ---- evictions ----

    @staticmethod
    def _result(call) -> tuple[int, dict]:
        try:
            resp = call()
        except ApiException as e:
            return e.status, json.loads(e.body) if e.body else {}
        return 201, resp if isinstance(resp, dict) else {}

    def evict(self, namespace: str, pod: str, *, dry_run: bool = False, descheduler: bool = False,
              api: client.ApiClient | None = None) -> tuple[int, dict]:
        """client-go's way (and the descheduler's, with ``descheduler``): (HTTP status, Status body)."""
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod, namespace=namespace,
                                         annotations=dict(DESCHEDULER_ANNOTATIONS) if descheduler else None),
            delete_options=client.V1DeleteOptions(dry_run=["All"] if dry_run else None))
        core = client.CoreV1Api(api) if api is not None else self.core
        return self._result(lambda: self.api.sanitize_for_serialization(
            core.create_namespaced_pod_eviction(pod, namespace, body)))

    def evict_raw(self, namespace: str, pod: str, *, dry_run: bool = False, query_dry_run: bool = False) -> tuple[int, dict]:
        """The body kubectl's drain helper posts, over HTTPS as the admin; ``query_dry_run``: ``?dryRun=All``
        instead of ``deleteOptions.dryRun`` (both are dry runs to the API server)."""
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace},
                "deleteOptions": {"dryRun": ["All"]} if dry_run else {}}
        with self.cp.admin_http(timeout=30) as http:
            r = http.post(f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", json=body,
                          params={"dryRun": "All"} if query_dry_run else None)
        self.last_warnings = r.headers.get_list("warning")
        return r.status_code, r.json()

    # ---- the audit log ----

    def audit_of_eviction(self, namespace: str, pod: str, *, after: int = 0, timeout: float = 10.0) -> dict:
        """The newest audit event of an eviction of ``namespace/pod`` (past the first ``after`` ones)."""
        def find():
            found = [e for e in self.cp.audit_events() if e.get("verb") == "create"
                     and e.get("objectRef", {}).get("subresource") == "eviction"
                     and e["objectRef"].get("namespace") == namespace and e["objectRef"].get("name") == pod]
            return found[-1] if len(found) > after else None
        return eventually(find, timeout, f"the audit event of the eviction of {namespace}/{pod}")

    def evictions_audited(self, namespace: str, pod: str) -> int:
        return len([e for e in self.cp.audit_events() if e.get("verb") == "create"
                    and e.get("objectRef", {}).get("subresource") == "eviction"
                    and e["objectRef"].get("namespace") == namespace and e["objectRef"].get("name") == pod])
