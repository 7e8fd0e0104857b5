"""Regenerate examples/demo-snapshot.yaml: a small cluster with VMIs in every interesting state.

The state is as of DEMO_NOW; `make run` serves it with `--now` set to that time,
so the demo shows the same decisions whenever it is run.
    python examples/build_demo_snapshot.py > examples/demo-snapshot.yaml
"""

from datetime import datetime, timedelta, timezone

import yaml

DEMO_NOW = datetime(2026, 11, 21, 12, 0, 0, tzinfo=timezone.utc)
NS = "vms"


def ts(minutes_ago: float) -> str:
    return (DEMO_NOW - timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name, cordoned=False):
    n = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {"kubevirt.io/schedulable": "true"}},
         "spec": {}}
    if cordoned:
        n["spec"] = {"unschedulable": True, "taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]}
    return n


def vmi(name, node_name, created=3000, migration=None, evacuation=None):
    status = {"phase": "Running", "nodeName": node_name}
    if migration:
        status["migrationState"] = migration
    if evacuation:
        status["evacuationNodeName"] = evacuation
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-vmi-{name}", "creationTimestamp": ts(created),
                         "labels": {"kubevirt.io/nodeName": node_name}},
            "spec": {"evictionStrategy": "LiveMigrate"}, "status": status}


def mstate(uid, src, dst, start, end=None, failed=False):
    s = {"migrationUid": uid, "sourceNode": src, "targetNode": dst, "startTimestamp": ts(start), "mode": "PreCopy"}
    if end is not None:
        s["endTimestamp"] = ts(end)
        s["completed"] = not failed
        s["failed"] = failed
    return s


def vmim(name, vmi_name, phase, created, state=None, evacuation=None):
    m = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
         "metadata": {"name": name, "namespace": NS, "uid": state["migrationUid"] if state else f"uid-{name}",
                      "creationTimestamp": ts(created), "labels": {"kubevirt.io/vmi-name": vmi_name}},
         "spec": {"vmiName": vmi_name}, "status": {"phase": phase}}
    if state:
        m["status"]["migrationState"] = state
    if evacuation:
        m["metadata"]["annotations"] = {"kubevirt.io/evacuationMigration": evacuation}
    return m


def pod(vmi_name, node_name, suffix="a1b2c", phase="Running", job=None, in_progress=False):
    labels = {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": f"uid-vmi-{vmi_name}", "vm.kubevirt.io/name": vmi_name}
    if job:
        labels["kubevirt.io/migrationJobUID"] = job
    ann = {"kubevirt.io/domain": vmi_name, "descheduler.alpha.kubernetes.io/request-evict-only": ""}
    if in_progress:
        ann["descheduler.alpha.kubernetes.io/eviction-in-progress"] = "true"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"virt-launcher-{vmi_name}-{suffix}", "namespace": NS, "uid": f"uid-pod-{vmi_name}-{suffix}",
                         "resourceVersion": "1000", "labels": labels, "annotations": ann},
            "spec": {"nodeName": node_name}, "status": {"phase": phase}}


items = [node("worker-a"), node("worker-b"), node("worker-c"), node("worker-d", cordoned=True)]
# rhel9-db-01: migrated worker-a -> worker-b, ended 5 minutes ago after 2 minutes: cooldown 15m, 10m left
items += [vmi("rhel9-db-01", "worker-b", migration=mstate("uid-mig-db-1", "worker-a", "worker-b", 7, 5)),
          vmim("rhel9-db-01-mig-1", "rhel9-db-01", "Succeeded", 8, mstate("uid-mig-db-1", "worker-a", "worker-b", 7, 5)),
          pod("rhel9-db-01", "worker-b"), pod("rhel9-db-01", "worker-a", suffix="old99", phase="Succeeded")]
# api-01: three 30-minute migrations in the last 48h, last ended 40 minutes ago: 30m x 2^2 = 2h cooldown
items += [vmi("api-01", "worker-b", created=6000, migration=mstate("uid-api-01-mig-3", "worker-c", "worker-b", 70, 40)),
          vmim("api-01-mig-1", "api-01", "Succeeded", 1500, mstate("uid-api-01-mig-1", "worker-a", "worker-c", 1490, 1460)),
          vmim("api-01-mig-2", "api-01", "Failed", 600, mstate("uid-api-01-mig-2", "worker-c", "worker-a", 590, 560, failed=True)),
          vmim("api-01-mig-3", "api-01", "Succeeded", 71, mstate("uid-api-01-mig-3", "worker-c", "worker-b", 70, 40)),
          pod("api-01", "worker-b")]
# win2022-app-03: evacuation from worker-c in flight to worker-d: source pod (rule 6) and target pod (rule 5)
items += [vmi("win2022-app-03", "worker-c", migration=mstate("uid-win-mig", "worker-c", "worker-b", 3), evacuation="worker-c"),
          vmim("kubevirt-evacuation-w1n", "win2022-app-03", "Running", 4, mstate("uid-win-mig", "worker-c", "worker-b", 3),
               evacuation="worker-c"),
          pod("win2022-app-03", "worker-c", in_progress=True), pod("win2022-app-03", "worker-b", suffix="zz9k8", phase="Pending", job="uid-win-mig")]
# web-01: marked for evacuation from worker-a, last attempt failed, retry pending (rule 7)
items += [vmi("web-01", "worker-a", evacuation="worker-a",
              migration=mstate("uid-kubevirt-evacuation-x7", "worker-a", "worker-c", 6, 4, failed=True)),
          vmim("kubevirt-evacuation-x7", "web-01", "Failed", 7, mstate("uid-kubevirt-evacuation-x7", "worker-a", "worker-c", 6, 4, failed=True),
               evacuation="worker-a"),
          pod("web-01", "worker-a", in_progress=True)]
# web-02: never migrated, but web-01 is already leaving worker-a (rule 8 for the descheduler)
items += [vmi("web-02", "worker-a"), pod("web-02", "worker-a")]
# cache-01: never migrated, quiet node: allowed
items += [vmi("cache-01", "worker-b"), pod("cache-01", "worker-b")]
# batch-01: migrated 10 minutes ago, but worker-d is cordoned (drain): allowed
items += [vmi("batch-01", "worker-d", migration=mstate("uid-batch-mig", "worker-c", "worker-d", 12, 10)), pod("batch-01", "worker-d")]
# old-01: last migration 3 days ago: allowed
items += [vmi("old-01", "worker-c", created=9000, migration=mstate("uid-old-mig", "worker-b", "worker-c", 4330, 4320)), pod("old-01", "worker-c")]
# an unrelated pod (skipped by the guard) and an unrelated kind (skipped by the loader)
items += [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nginx-5d9c", "namespace": "web", "labels": {"app": "nginx"}},
           "spec": {"nodeName": "worker-a"}, "status": {"phase": "Running"}},
          {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt", "namespace": NS}, "data": {}}]

if __name__ == "__main__":
    print(f"# Demo cluster state as of {DEMO_NOW:%Y-%m-%dT%H:%M:%SZ} (serve it with --now {DEMO_NOW:%Y-%m-%dT%H:%M:%SZ}).")
    print("# Generated by examples/build_demo_snapshot.py; shaped like `kubectl get vmi,vmim,pods,nodes -A -o yaml`.")
    print(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items},
                         sort_keys=False, width=200), end="")
