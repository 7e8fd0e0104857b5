"""A fake Kubernetes API server speaking the real wire protocol over HTTP on 127.0.0.1.

Why not kmock: kmock (PyPI, by kopf's author) is the maintained choice for
mocking the Kubernetes API, but its 0.8 emulator streams every object as ADDED
on each watch, has no BOOKMARK, no 410 for compacted versions, no pagination and
no ``timeoutSeconds``: exactly the behaviours a long-lived informer must survive.
(It is also not installable from this project's package index.) So this is a
small in-repo server that does those things the way kube-apiserver does.

What it serves (core/v1 pods, nodes, events; events.k8s.io/v1 events;
kubevirt.io/v1 virtualmachineinstances, virtualmachineinstancemigrations and kubevirts;
all namespaced or cluster-wide as the real ones; virt-api's discovery document of
subresources.kubevirt.io/v1 and its evacuate/cancel; SelfSubjectAccessReviews):

- list: consistent snapshot at a real, increasing ``resourceVersion`` (one
  global counter, as etcd), ``limit``/``continue`` pagination with
  ``remainingItemCount``, 410 Expired for a continue token older than a
  compaction, ``labelSelector`` (``a=b``, ``a!=b``, ``a``, ``!a``).
- watch: chunked JSON lines (``ADDED``/``MODIFIED``/``DELETED``/``BOOKMARK``/
  ``ERROR``) from a ``resourceVersion`` (history replayed), ``ERROR`` 410
  Expired (or HTTP 410 with ``expired_as_http=True``) for a compacted version,
  BOOKMARKs every ``bookmark_interval`` seconds when ``allowWatchBookmarks``,
  a clean end of the stream at ``timeoutSeconds``; label-selected watches see
  objects entering/leaving the selection as ADDED/DELETED.
- get, create (POST, ``generateName``, 409 AlreadyExists), update (PUT, 409 on a
  stale resourceVersion), delete, and PATCH with ``application/json-patch+json``
  (RFC 6902 incl. ``test``; a failed op is 422 Invalid as kube-apiserver answers;
  a patched ``metadata.resourceVersion`` that is not the current one is 409
  Conflict; a no-op patch does not bump the version) and merge patches.
  Every PATCH is recorded in ``server.patches``; Events (both APIs) are stored
  objects, ``server.events()`` lists them.
- errors as ``Status`` JSON: 404 for an absent API group, 403 for forbidden
  verbs, injected 429/500/503 (with ``Retry-After``), slow responses, going down
  (connection refused, open connections dropped) and coming back.

Use::

    from tests.fakeapi import FakeApiServer, objects as o

    with FakeApiServer(bookmark_interval=0.5) as api:
        api.put(o.node("worker-a"))
        api.put(o.vmi("vms", "db", node="worker-a"))
        api.put(o.launcher_pod("vms", "db", node="worker-a"))
        cfg = api.configuration()            # kubernetes.client.Configuration
        api.write_kubeconfig(tmp / "kubeconfig")
        ...
        api.delete("vmi", "vms", "db")        # DELETED to watchers
        api.update_status("vmi", "vms", "db", status)  # status only, as KubeVirt writes it (annotations stay)
        api.gc_finished_migrations("vms", "db")  # KubeVirt's VMIM GC: keep the 5 newest finished per VMI
        api.cut_streams("pod")                # drop watch connections mid-stream
        api.cut_streams(clean=True)           # end them as at timeoutSeconds
        api.stall_streams("vmi")              # silent, never closed: a dead connection without a FIN
        api.compact()                         # older versions now 410 Expired
        api.compact(expire_watches=True)      # ... and tell open watches so now
        api.send_bookmarks()
        api.emit_raw("vmi", b'{"type":"ADDED","object":{"kind":"VirtualMachineInstance"}}')
        api.fail(500, times=2, kind="vmi", verbs=["list"])
        api.fail(429, retry_after=1)
        api.set_latency(0.5, kind="pod")
        api.hold_streams(); api.release_streams()  # queue watch events, then flush them in a burst
        api.remove_api("kubevirt.io"); api.restore_api("kubevirt.io")
        api.kubevirt_subresources = ()        # virt-api without evacuate/cancel in its discovery (KubeVirt < 1.8)
        api.evacuate_cancel_forbidden = True  # RBAC without it: the PUT is 403, SSARs for it say denied
        api.denied_access.add((group, resource, subresource, verb)); api.access_reviews
        # KubeVirt >= 1.8: PUT /apis/subresources.kubevirt.io/v1/namespaces/NS/virtualmachineinstances/NAME/evacuate/cancel
        api.cancels                           # every cancel with its body and answer
        api.evacuate_cancel_forbidden = True  # 403, as without the RBAC rule
        api.remove_api("subresources.kubevirt.io")  # 404, as KubeVirt < 1.8
        api.forbid("vmim"); api.allow("vmim")
        api.down(); api.up()
        api.requests_for("vmi", watch=True)   # RequestRecord(method, path, query, status)
        api.patches, api.events()

``load(objects)`` bulk-loads without history (benchmarks): watches from before
it need a relist, as after a compaction. Kinds are named by Resource, plural
(``pods``, ``virtualmachineinstances``), kind (``Pod``) or short name (``pod``,
``vmi``, ``vmim``, ``node``, ``event``).
"""

from tests.fakeapi import objects
from tests.fakeapi.resources import EVENTS, EVENTS_V1, NODES, PODS, VMIMS, VMIS, Resource
from tests.fakeapi.server import FakeApiServer, Fault, PatchRecord, RequestRecord

__all__ = [
    "EVENTS",
    "EVENTS_V1",
    "NODES",
    "PODS",
    "VMIMS",
    "VMIS",
    "FakeApiServer",
    "Fault",
    "PatchRecord",
    "RequestRecord",
    "Resource",
    "objects",
]
