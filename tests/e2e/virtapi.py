"""A stand-in for KubeVirt's virt-api, registered as a real aggregated API: ``v1.subresources.kubevirt.io``.

Used only on the played control plane (the session's ``control_plane``, whose VMIs and VMIMs the tests write), where
no real KubeVirt runs because its states are written by hand, and only for what real KubeVirt reaches too slowly to
be asked on demand: stuck evacuations (three failed attempts each: minutes of virt-controller's backoff), which the
canceller check (a stuck evacuation on a drain-tainted node beside another), the RBAC check (every call the guard
makes, its cancel included, in one session's audit log) and the client-certificate check (the canceller's probe with
the chart's rule off) need. Everything else about ``evacuate/cancel`` runs against KubeVirt's own virt-api
(tests/e2e/test_real_kubevirt.py, test_real_side_effects.py).

What it serves is what virt-api serves for the guard (KubeVirt ``pkg/virt-api/api.go``, ``rest/authorizer.go``,
``rest/evacuate_cancel.go``; v1.8 and later), nothing else:

- discovery: ``/apis`` (an APIGroupList), ``/apis/subresources.kubevirt.io`` (the APIGroup; virt-api names it
  ``subresource.kubevirt.io``, without the s, and so does this), ``/apis/subresources.kubevirt.io/{v1,v1alpha3}``
  (virt-api's APIResourceList, every entry a name and ``namespaced: true`` only), all without authorization;
- ``PUT /apis/subresources.kubevirt.io/v1/namespaces/NS/virtualmachineinstances/NAME/evacuate/cancel``: authenticated
  by the API server's proxy client certificate (the request-header CA and allowed names of
  ``kube-system/extension-apiserver-authentication``, as virt-api reads them), authorized by a SubjectAccessReview of
  the caller named in ``X-Remote-User``/``-Group``/``-Extra-*`` for ``update`` on
  ``virtualmachineinstances/evacuate/cancel`` (denied: 401 with the review's reason, as virt-api answers), then: the
  VMI (404 ``virtualmachineinstance.kubevirt.io "NAME" not found``), refused with 400 when the node being left (or the
  VMI's node) carries the KubeVirt CR's ``nodeDrainTaintKey`` (default ``kubevirt.io/drain``) with effect
  NoSchedule, 200 with nothing done when the VMI is not marked, else a JSON patch of the VMI (``test`` of
  ``/status/evacuationNodeName`` against the body's ``evacuationNodeName``, then ``remove``; a failed patch is a 500,
  as virt-api wraps it). Like virt-api's route (no Produces), it answers 406 to an ``Accept`` header that does
  not allow ``*/*``.

It runs in the test process (a thread per connection) with virt-api's own identity: a ServiceAccount
``kubevirt/kubevirt-apiserver`` with the rights virt-api uses here (create SubjectAccessReviews, get and patch VMIs,
get nodes, read KubeVirt CRs, the ``extension-apiserver-authentication-reader`` Role), so its reviews and patches are
in the audit log under that name. ``reviews`` and ``requests`` record what it was asked and what it answered.

How the aggregator reaches it: a Service ``kubevirt/virt-api`` (port 443, as virt-operator creates it) and an
EndpointSlice for it that names this machine's own address (``host_address``) and the port the stand-in listens on;
kube-apiserver runs with ``--enable-aggregator-routing`` and so dials that endpoint. Its serving certificate is for
``virt-api.kubevirt.svc`` (the name the aggregator verifies) from its own CA, the APIService's ``caBundle``.
"""

from __future__ import annotations

import base64
import http.server
import json
import re
import ssl
import sys
import threading
import traceback
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import httpx

from tests.e2e.controlplane import CertificateAuthority, ControlPlane, host_address, legacy_endpoints

GROUP = "subresources.kubevirt.io"
VERSIONS = ("v1", "v1alpha3")
NAMESPACE, SERVICE, SERVICE_ACCOUNT = "kubevirt", "virt-api", "kubevirt-apiserver"
APISERVICE = f"v1.{GROUP}"
DRAIN_TAINT_KEY = "kubevirt.io/drain"  # virt-config's NodeDrainTaintDefaultKey
CANCEL = re.compile(rf"^/apis/{re.escape(GROUP)}/(v1|v1alpha3)/namespaces/([^/]+)/virtualmachineinstances/([^/]+)"
                    r"/evacuate/cancel$")
# virt-api's discovery entries for subresources.kubevirt.io (api.go, composeSubresources), in its order
RESOURCES = (
    "expand-vm-spec", "virtualmachineinstances/vnc", "virtualmachineinstances/vnc/screenshot",
    "virtualmachineinstances/console", "virtualmachineinstances/portforward", "virtualmachineinstances/backup",
    "virtualmachineinstances/redefine-checkpoint", "virtualmachineinstances/pause", "virtualmachineinstances/unpause",
    "virtualmachineinstances/freeze", "virtualmachineinstances/unfreeze", "virtualmachineinstances/reset",
    "virtualmachineinstances/softreboot", "virtualmachines/start", "virtualmachines/stop", "virtualmachines/restart",
    "virtualmachines/migrate", "virtualmachines/expand-spec", "virtualmachines/objectgraph",
    "virtualmachines/evacuate/cancel", "virtualmachineinstances/guestosinfo", "virtualmachineinstances/userlist",
    "virtualmachineinstances/filesystemlist", "virtualmachineinstances/addvolume",
    "virtualmachineinstances/removevolume", "virtualmachineinstances/objectgraph",
    "virtualmachineinstances/sev/fetchcertchain", "virtualmachineinstances/sev/querylaunchmeasurement",
    "virtualmachineinstances/sev/setupsession", "virtualmachineinstances/sev/injectlaunchsecret",
    "virtualmachineinstances/evacuate/cancel",
)
# paths virt-api answers without authorization (authorizer.go noAuthEndpoints; those served here)
NO_AUTH = {"/", "/apis", "/healthz", f"/apis/{GROUP}", *(f"/apis/{GROUP}/{v}" for v in VERSIONS)}
RBAC = [
    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachineinstances"], "verbs": ["get", "patch"]},
    {"apiGroups": ["kubevirt.io"], "resources": ["kubevirts"], "verbs": ["get", "list"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
]


def api_group() -> dict:
    """virt-api's ``subresourceAPIGroup()``."""
    versions = [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in VERSIONS]
    return {"kind": "APIGroup", "name": "subresource.kubevirt.io", "versions": versions,
            "preferredVersion": versions[0],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]}


def resource_list(version: str) -> dict:
    """virt-api's APIResourceList for ``version`` (metav1.APIResource with only name and namespaced set)."""
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{version}",
            "resources": [{"name": n, "singularName": "", "namespaced": True, "kind": "", "verbs": None}
                          for n in RESOURCES]}


def status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
         "reason": reason, "code": code}
    if details:
        s["details"] = details
    return s


@dataclass
class Review:
    """One SubjectAccessReview the stand-in made for a caller, and the API server's answer."""

    user: str
    groups: list[str]
    attributes: dict
    allowed: bool
    reason: str


@dataclass
class Request:
    method: str
    path: str
    user: str  # X-Remote-User ("" for unauthenticated discovery)
    code: int
    body: dict = field(default_factory=dict)


class VirtApi:
    """``VirtApi(cp, workdir).start()`` registers the APIService and returns once the API server calls it Available
    and serves its discovery; ``stop()`` deletes the APIService, its Service and EndpointSlice, and stops serving."""

    def __init__(self, cp: ControlPlane, workdir: Path, address: str | None = None) -> None:
        self.cp = cp
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.address = address or host_address()
        self.ca = CertificateAuthority("e2e-virt-api-ca")
        cert, key = self.ca.issue(SERVICE, server=True, dns_names=(
            f"{SERVICE}.{NAMESPACE}", f"{SERVICE}.{NAMESPACE}.svc", f"{SERVICE}.{NAMESPACE}.svc.cluster.local"))
        (self.dir / "tls.crt").write_bytes(cert)
        (self.dir / "tls.key").write_bytes(key)
        (self.dir / "tls.key").chmod(0o600)
        self.reviews: list[Review] = []
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.http: httpx.Client | None = None
        self.allowed_names: list[str] = []
        self.user = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"

    # ---- set-up ----------------------------------------------------------------------------------------------

    def _identity(self) -> None:
        """virt-api's ServiceAccount, its rights, its token."""
        kubectl = self.cp.kubectl
        if kubectl("get", "namespace", NAMESPACE, check=False).returncode != 0:
            kubectl("create", "namespace", NAMESPACE)
        docs = [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": "e2e-kubevirt-apiserver"}, "rules": RBAC},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": "e2e-kubevirt-apiserver"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "e2e-kubevirt-apiserver"},
             "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "e2e-kubevirt-apiserver-auth-reader", "namespace": "kube-system"},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                         "name": "extension-apiserver-authentication-reader"},
             "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]},
        ]
        # one List: kubectl 1.30 reads a stream that starts with "{" as JSON only (k8s.io/apimachinery v0.30.14
        # pkg/util/yaml/decoder.go, YAMLOrJSONDecoder: GuessJSONStream), so "---" between JSON documents breaks it
        kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
        token = self.cp.service_account_token(NAMESPACE, SERVICE_ACCOUNT)
        self.http = httpx.Client(base_url=self.cp.url, verify=ssl.create_default_context(cafile=str(self.cp.ca_path)),
                                 headers={"Authorization": f"Bearer {token}"}, timeout=10)

    def _tls(self) -> ssl.SSLContext:
        """virt-api's TLS: its serving certificate; a client certificate verified if given (VerifyClientCertIfGiven)
        against the request-header CA the API server publishes, whose CN must be one of the allowed names."""
        assert self.http is not None
        r = self.http.get("/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication")
        r.raise_for_status()
        data = r.json()["data"]
        self.allowed_names = json.loads(data.get("requestheader-allowed-names") or "[]")
        self.headers = {k: json.loads(data.get(f"requestheader-{k}-headers") or "[]") for k in ("username", "group")}
        self.extra_prefixes = json.loads(data.get("requestheader-extra-headers-prefix") or "[]")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(self.dir / "tls.crt"), str(self.dir / "tls.key"))
        ctx.load_verify_locations(cadata=data["requestheader-client-ca-file"])
        ctx.verify_mode = ssl.CERT_OPTIONAL
        return ctx

    def _register(self, port: int) -> None:
        docs = [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": NAMESPACE},
             "spec": {"type": "ClusterIP", "ports": [{"port": 443, "targetPort": 8443, "protocol": "TCP"}],
                      "selector": {"kubevirt.io": "virt-api"}}},
            # what the EndpointSlice controller would write for a Ready virt-api pod at this machine's address
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": f"{SERVICE}-e2e", "namespace": NAMESPACE,
                          "labels": {"kubernetes.io/service-name": SERVICE,
                                     "endpointslice.kubernetes.io/managed-by": "e2e.kubevirt-eviction-guard.io"}},
             "addressType": "IPv4", "ports": [{"name": "", "port": port, "protocol": "TCP"}],
             "endpoints": [{"addresses": [self.address], "conditions": {"ready": True}}]},
            legacy_endpoints(NAMESPACE, SERVICE, self.address, port),
            # virt-operator's APIService (groupPriorityMinimum 1000, versionPriority 15)
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": APISERVICE},
             "spec": {"group": GROUP, "version": "v1", "groupPriorityMinimum": 1000, "versionPriority": 15,
                      "caBundle": base64.b64encode(self.ca.pem).decode(),
                      "service": {"namespace": NAMESPACE, "name": SERVICE, "port": 443}}},
        ]
        self.cp.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))

    def start(self, timeout: float = 60) -> VirtApi:
        self._identity()
        ctx = self._tls()
        handler = type("Handler", (_Handler,), {"api": self})
        self._server = _Server((self.address, 0), handler)
        self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True, do_handshake_on_connect=False)
        self._thread = threading.Thread(target=self._server.serve_forever, name="virt-api", daemon=True)
        self._thread.start()
        self.port = self._server.server_address[1]
        self._register(self.port)
        self.wait_available(timeout)
        return self

    def wait_available(self, timeout: float = 60) -> None:
        """Until the APIService is Available and the API server serves the group's discovery from here."""
        deadline = time.monotonic() + timeout
        last = ""
        with self.cp.admin_http(timeout=10) as c:
            while time.monotonic() < deadline:
                svc = c.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}").json()
                cond = next((x for x in svc.get("status", {}).get("conditions", []) if x["type"] == "Available"), {})
                last = f"{cond.get('status')} {cond.get('reason')}: {cond.get('message')}"
                if cond.get("status") == "True":
                    r = c.get(f"/apis/{GROUP}/v1")
                    if r.status_code == 200 and any(x["name"] == "virtualmachineinstances/evacuate/cancel"
                                                    for x in r.json().get("resources", [])):
                        return
                    last = f"discovery {r.status_code}"
                time.sleep(0.2)
        raise TimeoutError(f"APIService {APISERVICE} not available in {timeout:.0f} s: {last}")

    def stop(self) -> None:
        self.cp.kubectl("delete", "apiservice", APISERVICE, "--ignore-not-found", check=False)
        self.cp.kubectl("-n", NAMESPACE, "delete", "service", SERVICE, "--ignore-not-found", check=False)
        self.cp.kubectl("-n", NAMESPACE, "delete", "endpointslice", f"{SERVICE}-e2e", "--ignore-not-found", check=False)
        self.cp.kubectl("-n", NAMESPACE, "delete", "endpoints", SERVICE, "--ignore-not-found", check=False)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self.http is not None:
            self.http.close()

    # ---- what it did --------------------------------------------------------------------------------------------

    @property
    def errors(self) -> list[str]:
        return list(self._server.errors) if self._server else []

    def reviews_of(self, user: str) -> list[Review]:
        with self._lock:
            return [r for r in self.reviews if r.user == user]

    def requests_of(self, method: str, path_suffix: str = "") -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == method and r.path.endswith(path_suffix)]

    def _record(self, item) -> None:
        with self._lock:
            (self.reviews if isinstance(item, Review) else self.requests).append(item)

    # ---- virt-api's handling ----------------------------------------------------------------------------------

    def authorize(self, method: str, path: str, headers) -> tuple[bool, str, str]:
        """virt-api's ``authorizor.Authorize`` for a subresource path: (allowed, reason, user)."""
        user = next((headers[h] for h in self.headers["username"] if h in headers), None)
        groups = next((headers.get_all(h) for h in self.headers["group"] if h in headers), None)
        if user is None:
            return False, "a valid user header is required for authorization", ""
        if groups is None:
            return False, "a valid group header is required for authorization", user
        extra: dict[str, list[str]] = {}
        for prefix in self.extra_prefixes:
            for k in headers.keys():
                if k.lower().startswith(prefix.lower()):
                    extra.setdefault(unquote(k[len(prefix):].lower()), []).extend(headers.get_all(k))
        parts = path.split("/")
        if len(parts) < 9 or parts[6] not in ("virtualmachineinstances", "virtualmachines"):
            return False, f"unknown api endpoint: {path}", user
        verb = {"PUT": "update", "POST": "create", "PATCH": "patch", "DELETE": "delete"}.get(method, "get")
        attrs = {"namespace": parts[5], "verb": verb, "group": parts[2], "version": parts[3], "resource": parts[6],
                 "subresource": "/".join(parts[8:]), "name": parts[7]}
        sar = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
               "spec": {"user": user, "groups": groups, "extra": extra, "resourceAttributes": attrs}}
        assert self.http is not None
        r = self.http.post("/apis/authorization.k8s.io/v1/subjectaccessreviews", json=sar)
        r.raise_for_status()
        st = r.json().get("status", {})
        self._record(Review(user, groups, attrs, st.get("allowed") is True, st.get("reason", "")))
        return st.get("allowed") is True, st.get("reason", ""), user

    def cancel(self, namespace: str, name: str, body: bytes) -> tuple[int, dict | None]:
        """``EvacuateCancelHandler``: (HTTP status, Status body or None)."""
        assert self.http is not None
        r = self.http.get(f"/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances/{name}")
        if r.status_code == 404:
            return 404, status(404, "NotFound", f'virtualmachineinstance.kubevirt.io "{name}" not found',
                               {"name": name, "group": "kubevirt.io", "kind": "virtualmachineinstance"})
        if r.status_code != 200:
            return 500, status(500, "InternalError", f"Internal error occurred: unable to retrieve vmi [{name}]: "
                               f"{r.status_code}")
        vmi = r.json()
        vstatus = vmi.get("status") or {}
        node_name = vstatus.get("evacuationNodeName") or vstatus.get("nodeName") or ""
        key = self.drain_taint_key()
        node = self.http.get(f"/api/v1/nodes/{node_name}")
        if node.status_code != 200:
            return 500, status(500, "InternalError", f"Internal error occurred: node {node_name}: {node.status_code}")
        for t in (node.json().get("spec") or {}).get("taints") or []:
            if t.get("key") == key and t.get("effect") == "NoSchedule":
                # virt-api formats the *Taint with its generated String() (evacuate_cancel.go validateEvacuationNode)
                return 400, status(400, "BadRequest", f'Node "{node_name}" has NodeDrainTaintKey '
                                                      f'"&Taint{{Key:{key},Value:,Effect:NoSchedule,TimeAdded:<nil>,}}"')
        if not vstatus.get("evacuationNodeName"):
            return 200, None
        try:
            opts = json.loads(body or b"{}")
        except ValueError as e:
            return 400, status(400, "BadRequest", f"Can not unmarshal Request body to struct, error: {e}")
        want = opts.get("evacuationNodeName", "") if isinstance(opts, dict) else ""
        patch = [{"op": "test", "path": "/status/evacuationNodeName", "value": want},
                 {"op": "remove", "path": "/status/evacuationNodeName"}]
        p = self.http.patch(f"/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances/{name}",
                            content=json.dumps(patch), headers={"Content-Type": "application/json-patch+json"},
                            params={"dryRun": "All"} if opts.get("dryRun") else None)
        if p.status_code != 200:
            return 500, status(500, "InternalError", f"Internal error occurred: {p.json().get('message', p.text)}")
        return 200, None

    def drain_taint_key(self) -> str:
        """``spec.configuration.migrations.nodeDrainTaintKey`` of the KubeVirt CR, else KubeVirt's default."""
        assert self.http is not None
        r = self.http.get("/apis/kubevirt.io/v1/kubevirts")
        for kv in r.json().get("items", []) if r.status_code == 200 else []:
            key = (((kv.get("spec") or {}).get("configuration") or {}).get("migrations") or {}).get("nodeDrainTaintKey")
            if key:
                return key
        return DRAIN_TAINT_KEY


def _accepts_any(accept: str | None) -> bool:
    """go-restful's check for a route without Produces: no Accept header, or one of its types is */*."""
    if not accept:
        return True
    return any(t.split(";", 1)[0].strip() == "*/*" for t in accept.split(","))


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.errors: list[str] = []  # what a connection ended with, beside TLS failures (a bug here shows up)

    def handle_error(self, request, client_address) -> None:
        e = sys.exc_info()[1]
        if not isinstance(e, (ssl.SSLError, ConnectionError, TimeoutError)):
            self.errors.append(traceback.format_exc())


class _Handler(http.server.BaseHTTPRequestHandler):
    api: VirtApi
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args) -> None:  # noqa: A002 - the base class's name
        pass

    def _send(self, code: int, body: dict | None, content_type: str = "application/json") -> None:
        data = json.dumps(body).encode() if body is not None else b""
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _peer_ok(self) -> bool:
        """A client certificate was given (the TLS layer verified it against the request-header CA) with an allowed
        CN: virt-api's ``isAuthenticated`` and its ``VerifyPeerCertificate``."""
        cert = self.connection.getpeercert()
        if not cert:
            return False
        cn = next((v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"), "")
        return not self.api.allowed_names or cn in self.api.allowed_names

    def _handle(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        code, out, user = 404, status(404, "NotFound", "the server could not find the requested resource"), ""
        if method == "GET" and path in NO_AUTH:
            code, out = 200, self._discovery(path)
        else:
            allowed, reason, user = (self.api.authorize(method, path, self.headers) if self._peer_ok()
                                     else (False, "request is not authenticated", ""))
            if not allowed:  # virt-api's filter: 401 with the reason
                self._plain(401, reason)
                self.api._record(Request(method, path, user, 401))
                return
            m = CANCEL.match(path)
            if method == "PUT" and m and not _accepts_any(self.headers.get("Accept")):
                # the route declares no Produces: go-restful (route.go matchesAccept) serves it only to an Accept
                # that allows */*, else 406 with its plain-text body
                self._plain(406, "406: Not Acceptable\n\nAvailable representations: ")
                self.api._record(Request(method, path, user, 406))
                return
            if method == "PUT" and m:
                code, out = self.api.cancel(m.group(2), m.group(3), body)
        self._send(code, out)
        try:
            parsed = json.loads(body) if body else {}
        except ValueError:
            parsed = {"raw": body.decode(errors="replace")}
        self.api._record(Request(method, path, user, code, parsed if isinstance(parsed, dict) else {}))

    def _plain(self, code: int, text: str) -> None:
        """go-restful's ``WriteErrorString``: the reason as plain text."""
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _discovery(self, path: str) -> dict:
        if path == "/":
            return {"paths": ["/apis", "/openapi/v2", *(p for v in VERSIONS for p in (f"/apis/{GROUP}",
                                                                                     f"/apis/{GROUP}/{v}"))]}
        if path == "/apis":
            return {"kind": "APIGroupList", "groups": [api_group()]}
        if path == f"/apis/{GROUP}":
            return api_group()
        if path == "/healthz":
            return {}
        return resource_list(path.rsplit("/", 1)[1])

    def do_GET(self) -> None:  # noqa: N802 - http.server's names
        self._handle("GET")

    def do_PUT(self) -> None:  # noqa: N802
        self._handle("PUT")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def do_PATCH(self) -> None:  # noqa: N802
        self._handle("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._handle("DELETE")
