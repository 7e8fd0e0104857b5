"""KubeVirt's eviction admitter (virt-api's ``virt-launcher-eviction-interceptor.kubevirt.io``) as a real webhook.

Registered by ``objects.admitter_webhook`` as a *validating* webhook on ``pods/eviction`` (failurePolicy Fail,
timeoutSeconds 10, matchCondition ``only-vms``), so when the guard is installed (a mutating webhook) the guard runs
first and a denial by it never reaches here. Its checks, in KubeVirt's order (kubevirt-facts.md), are the model's
(``app.sim.kubevirt.KubeVirt.admit_eviction``): VMI already marked -> 429 ``Evacuation in progress: Eviction
triggered evacuation of VMI "NS/NAME"``; pod not on the VMI's node -> 429 ``Eviction request for target Pod``;
otherwise mark the VMI (``status.evacuationNodeName``, and ``kubevirt.io/eviction-source: descheduler`` when the
Eviction says ``requested-by: sigs.k8s.io/descheduler``) and answer 429 ``Eviction triggered evacuation of VMI
"NS/NAME"``. Dry run, in either shape (``request.dryRun``, or ``deleteOptions.dryRun: ["All"]`` in the Eviction
with ``request.dryRun`` false), gets the same answer without the mark. A pod KubeVirt does not know is let through.

The mark is written to the API server before the answer goes back (KubeVirt patches the VMI inside the admission
call), so whoever acts on the 429 already sees it. Every call is recorded for the outcome's figures.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from app.sim.kubevirt import BACKGROUND, NAMESPACE
from tests.e2e.actor.kubevirt import RealKubeVirt

log = logging.getLogger("actor.admitter")
DESCHEDULER = "sigs.k8s.io/descheduler"
TARGET_POD = "Eviction request for target Pod"


def dry_run(request: dict) -> bool:
    obj = request.get("object") if isinstance(request.get("object"), dict) else {}
    options = obj.get("deleteOptions") if isinstance(obj.get("deleteOptions"), dict) else {}
    return request.get("dryRun") is True or "All" in (options.get("dryRun") or [])


class Admitter:
    def __init__(self, kv: RealKubeVirt, lock: threading.RLock) -> None:
        self.kv = kv
        self.lock = lock
        self.records: list[dict[str, Any]] = []
        self.server: ThreadingHTTPServer | None = None

    def review(self, body: dict) -> dict:
        request = body.get("request") if isinstance(body.get("request"), dict) else {}
        uid = request.get("uid", "")
        name = request.get("name", "")
        obj = request.get("object") if isinstance(request.get("object"), dict) else {}
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        from_descheduler = annotations.get("requested-by") == DESCHEDULER
        dry = dry_run(request)
        kv = self.kv
        with self.lock:
            now = kv.clock.now()
            pod = kv.pods.get(name) if request.get("namespace") == NAMESPACE else None
            vmi = pod.vmi if pod is not None else None
            record = {"t": kv.clock.elapsed(), "pod": name, "vmi": vmi.name if vmi else "", "dry_run": dry,
                      "from_descheduler": from_descheduler, "user": (request.get("userInfo") or {}).get("username"),
                      "marked": bool(vmi and vmi.evacuation_node), "migrating": bool(vmi and kv.migrating(vmi)),
                      "node": pod.node.name if pod else ""}
            if vmi is None:
                allowed, message, reason = True, "", "kubevirt_not_found"
            elif dry:
                allowed, message, reason = self._dry_answer(pod, vmi)
            else:
                answer = kv.admit_eviction(name, now, from_descheduler)
                allowed, reason = answer.allowed, answer.reason
                message = TARGET_POD if reason == "kubevirt_target_pod" else answer.message
            record.update(allowed=allowed, reason=reason, message=message)
            self.records.append(record)
            seq = kv.writer.last()
        if not dry and reason == "kubevirt_evacuation":
            kv.writer.wait(seq, timeout=8)  # the mark is on the API server before the 429 goes back
        response: dict[str, Any] = {"uid": uid, "allowed": allowed}
        if not allowed:
            response["status"] = {"code": 429, "message": message}
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}

    @staticmethod
    def _dry_answer(pod, vmi) -> tuple[bool, str, str]:
        ref = f'VMI "{NAMESPACE}/{vmi.name}"'
        if vmi.evacuation_node:
            return False, f"Evacuation in progress: {BACKGROUND} of {ref}", "kubevirt_evacuation_in_progress"
        if pod.node is not vmi.node:
            return False, TARGET_POD, "kubevirt_target_pod"
        return False, f"{BACKGROUND} of {ref}", "kubevirt_evacuation"

    def serve(self, cert: Path, key: Path) -> int:
        admitter = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    body = json.loads(self.rfile.read(length) or b"{}")
                    out = json.dumps(admitter.review(body if isinstance(body, dict) else {})).encode()
                    code = 200
                except (ValueError, TypeError) as e:
                    out, code = json.dumps({"error": f"bad AdmissionReview: {e}"}).encode(), 400
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, fmt: str, *args) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self.server = server
        threading.Thread(target=server.serve_forever, name="admitter", daemon=True).start()
        return server.server_address[1]

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
