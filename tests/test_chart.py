"""The Helm chart, rendered by Helm's own engine (helm-python-sdk bundles Helm's Go SDK; no helm binary).

Every rendered manifest is validated against the Kubernetes OpenAPI schemas (kubernetes-validate, strict: unknown
fields fail) for the oldest supported and the newest known Kubernetes. Kinds defined by CRDs (cert-manager,
prometheus-operator) have no schema there; their structure is asserted directly.
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import json
import re
from functools import cache
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from kubernetes import client
from prometheus_client import CollectorRegistry

from app.cli import build_parser
from app.cluster.descheduler import DeschedulerCheck
from app.config import build_settings, load_config_file
from app.metrics import Metrics
from app.transport.tlsreload import ReloadMetrics
from tests.fakeapi import FakeApiServer
from tests.values import merge

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "kubevirt-eviction-guard"
NS = "vm-guard"
RELEASE = "guard"
FULLNAME = "guard-kubevirt-eviction-guard"
KUBE_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())
CRD_KINDS = {"Certificate", "Issuer", "ServiceMonitor", "PrometheusRule"}
MONITORING = {"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}}
CA_B64 = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
CERT_MODES = {
    "helm": {"certificates": {"mode": "helm"}},
    "certManager": {"certificates": {"mode": "certManager"}},
    "certManager-issuer": {"certificates": {"mode": "certManager", "certManager": {
        "issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}}}},
    "secret": {"certificates": {"mode": "secret", "secret": {"name": "my-tls", "caBundle": CA_B64}}},
}
WEBHOOK_TYPES = ("mutating", "validating")
MATRIX = list(itertools.product(CERT_MODES, WEBHOOK_TYPES))


@pytest.fixture(scope="module")
def chart():
    with helm.Chart.load(CHART) as c:
        yield c


def docs_of(rendered: dict[str, str]) -> list[dict]:
    docs = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


@cache
def _render_cached(key: str) -> tuple[dict, ...]:
    with helm.Chart.load(CHART) as c:
        return tuple(docs_of(c.render(json.loads(key), name=RELEASE, namespace=NS)))


def render(values: dict | None = None) -> list[dict]:
    return [json.loads(json.dumps(d)) for d in _render_cached(json.dumps(values or {}, sort_keys=True))]


def matrix_values(mode: str, kind: str) -> dict:
    return merge(CERT_MODES[mode], {"webhook": {"type": kind}}, MONITORING)


def one(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def webhook_config(docs: list[dict]) -> dict:
    found = [d for d in docs if d["kind"].endswith("WebhookConfiguration")]
    assert len(found) == 1
    return found[0]


def container(docs: list[dict]) -> dict:
    return one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


# ---- every manifest is valid Kubernetes ------------------------------------------------------------


@pytest.mark.parametrize(("mode", "kind"), MATRIX)
def test_every_manifest_validates_against_the_kubernetes_schemas(mode, kind):
    docs = render(matrix_values(mode, kind))
    validated = set()
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue  # structure asserted below
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} invalid for Kubernetes {version}: "
                            f"{'/'.join(map(str, e.path))}: {e.message}")
        validated.add(doc["kind"])
    expected = {"Deployment", "Service", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
                "PodDisruptionBudget", f"{kind.capitalize()}WebhookConfiguration", "NetworkPolicy",
                "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    if mode == "helm":
        expected.add("Secret")
    assert validated == expected
    assert {d["kind"] for d in docs} - validated <= CRD_KINDS


@pytest.mark.parametrize("mode", list(CERT_MODES))
def test_helm_lint_strict_finds_nothing_to_warn_about(mode):
    report = helm.lint(CHART, merge(CERT_MODES[mode], MONITORING), strict=True, namespace=NS, kube_version="v1.30.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_validation_is_not_vacuous():
    deployment = one(render(), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystme"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, "1.30", strict=True)


def test_everything_is_namespaced_to_the_release_or_cluster_scoped():
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                      "ValidatingAdmissionPolicyBinding"}
    for doc in render(merge(MONITORING, DESCHEDULER_ROLE)):
        if doc["kind"] in ("Role", "RoleBinding"):  # the descheduler check's, in the operator's namespace
            assert doc["metadata"]["namespace"] == "openshift-kube-descheduler-operator"
            continue
        assert doc["metadata"].get("namespace") == (None if doc["kind"] in cluster_scoped else NS), doc["kind"]


# ---- the Deployment ------------------------------------------------------------------------------


def test_deployment_is_hardened():
    docs = render()
    spec = one(docs, "Deployment")["spec"]
    pod = spec["template"]["spec"]
    assert spec["replicas"] == 2
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(docs)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    res = container(docs)["resources"]
    assert res["requests"]["cpu"] and res["requests"]["memory"] and res["limits"]["memory"]
    # writable scratch only in memory; the root filesystem stays read-only
    assert {"name": "tmp", "mountPath": "/tmp"} in container(docs)["volumeMounts"]


def test_anti_affinity_spreads_replicas_over_nodes():
    soft = one(render(), "Deployment")["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = soft["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    hard = one(render({"podAntiAffinity": "hard"}), "Deployment")["spec"]["template"]["spec"]["affinity"]
    required = hard["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert required["topologyKey"] == "kubernetes.io/hostname"
    pod_labels = one(render(), "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert required["labelSelector"]["matchLabels"].items() <= pod_labels.items()
    assert "affinity" not in one(render({"podAntiAffinity": "none"}), "Deployment")["spec"]["template"]["spec"]


def test_probes_and_graceful_termination():
    docs = render()
    c = container(docs)
    https_port = next(p for p in c["ports"] if p["name"] == "https")["containerPort"]
    assert https_port == 8443
    # the webhook's own port: its probes fail when it stops answering (no client certificate needed for them)
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = c[probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == (path, "https", "HTTPS"), probe
    # the startup probe gives the guard time to list the cluster before liveness can kill it
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 30
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert c["lifecycle"]["preStop"]["sleep"]["seconds"] > 0
    assert pod["terminationGracePeriodSeconds"] > c["lifecycle"]["preStop"]["sleep"]["seconds"] + 20  # + uvicorn's 20 s drain


def test_pod_disruption_budget_keeps_one_replica_and_never_blocks_drains_when_unhealthy():
    docs = render()
    pdb = one(docs, "PodDisruptionBudget")["spec"]
    assert pdb["maxUnavailable"] == 1 and "minAvailable" not in pdb
    assert pdb["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert pdb["selector"]["matchLabels"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    pdb = one(render({"podDisruptionBudget": {"minAvailable": 1}}), "PodDisruptionBudget")["spec"]
    assert pdb["minAvailable"] == 1 and "maxUnavailable" not in pdb


def test_args_are_accepted_by_the_guards_own_command_line():
    """The image's entrypoint is `kubevirt-eviction-guard serve`: the args must parse as serve's flags."""
    docs = render({"server": {"logFormat": "text", "tlsReloadInterval": 2, "staleAfter": "3m"},
                   "deschedulerCheck": {"namespace": "d"}})
    args = build_parser().parse_args(["serve", *container(docs)["args"]])
    mounts = {m["name"]: m["mountPath"] for m in container(docs)["volumeMounts"]}
    assert args.port == 8443 and args.metrics_port == 8080 and args.host == "0.0.0.0"
    assert args.tls_cert == f"{mounts['tls']}/tls.crt" and args.tls_key == f"{mounts['tls']}/tls.key"
    assert args.config == f"{mounts['config']}/config.yaml"
    assert args.log_format == "text" and args.tls_reload_interval == 2
    assert args.descheduler_check is True and args.descheduler_namespace == "d"
    assert args.stale_after == "3m"
    assert args.snapshot is None and args.kubeconfig is None  # live mode: in-cluster config
    assert "--stale-after" not in " ".join(container(render())["args"])  # the guard's default unless set
    off = build_parser().parse_args(["serve", *container(render({"deschedulerCheck": {"enabled": False}}))["args"]])
    assert off.descheduler_check is False


def test_policy_values_become_a_config_file_the_guard_accepts(tmp_path):
    policy = {"migrationCooldown": "10m", "maxMigrationCooldown": "0", "migrationHistoryWindow": "24h",
              "cooldownScope": "all", "deschedulerUsers": ["system:serviceaccount:kube-system:descheduler"],
              "pendingEvacuationsPerNode": 2, "evacuationStaleAfter": "90m", "honorPreferNoEviction": False,
              "refuseNotMigratable": False,
              "evacuationStaleAfterFailures": 5,
              "nodeCooldown": "5m", "targetNodeCooldown": "30m", "nodeCooldownWindow": "0s", "maxNodeCooldown": "2h",
              "targetNodeCooldownChurnOnly": True}
    docs = render({"policy": policy})
    (tmp_path / "config.yaml").write_text(one(docs, "ConfigMap")["data"]["config.yaml"])
    settings = build_settings(load_config_file(tmp_path / "config.yaml"))
    assert settings.migration_cooldown == 600 and settings.max_migration_cooldown == 0
    assert settings.migration_history_window == 86400 and settings.cooldown_scope == "all"
    assert settings.descheduler_users == frozenset(policy["deschedulerUsers"])
    assert settings.pending_evacuations_per_node == 2 and settings.evacuation_stale_after == 5400
    assert settings.honor_prefer_no_eviction is False and settings.refuse_not_migratable is False
    assert settings.evacuation_stale_after_failures == 5
    assert (settings.node_cooldown, settings.target_node_cooldown, settings.node_cooldown_window,
            settings.max_node_cooldown, settings.target_node_cooldown_churn_only) == (300, 1800, 0, 7200, True)
    # a policy change rolls the pods (the config checksum is in the pod template)
    before = one(render(), "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    after = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert before != after


def test_default_policy_values_equal_the_guards_defaults(tmp_path):
    (tmp_path / "config.yaml").write_text(one(render(), "ConfigMap")["data"]["config.yaml"])
    assert build_settings(load_config_file(tmp_path / "config.yaml")) == build_settings({})


# ---- Service and RBAC ----------------------------------------------------------------------------


def test_service_maps_443_to_https_and_has_a_separate_metrics_port():
    docs = render()
    ports = {p["name"]: p for p in one(docs, "Service")["spec"]["ports"]}
    assert (ports["https"]["port"], ports["https"]["targetPort"]) == (443, "https")
    assert (ports["metrics"]["port"], ports["metrics"]["targetPort"]) == (8080, "metrics")
    container_ports = {p["name"]: p["containerPort"] for p in container(docs)["ports"]}
    assert container_ports == {"https": 8443, "metrics": 8080}
    assert one(docs, "Service")["spec"]["selector"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]


def grants(role: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


LEAST_PRIVILEGE = (
    {(g, r, v) for g, r in (("kubevirt.io", "virtualmachineinstances"), ("kubevirt.io", "virtualmachineinstancemigrations"),
                            ("kubevirt.io", "kubevirts"), ("", "pods"), ("", "nodes")) for v in ("get", "list", "watch")}
    | {("", "pods", "patch"), ("kubevirt.io", "virtualmachineinstances", "patch"),
       ("kubevirt.io", "virtualmachineinstancemigrations", "patch")}
    | {("", "events", v) for v in ("create", "patch")}
)
HISTORY_WRITE = {("kubevirt.io", "virtualmachineinstances", "patch")}
CAUSE_WRITE = {("kubevirt.io", "virtualmachineinstancemigrations", "patch")}  # the cause annotation on VMIMs
DESCHEDULER_ROLE = {"deschedulerCheck": {"createRole": "always"}}
DESCHEDULER_READ = {("operator.openshift.io", "kubedeschedulers", v) for v in ("get", "list", "watch")}
# kube-apiserver authorizes .../evacuate/cancel as subresource "evacuate", virt-api as "evacuate/cancel"
CANCEL = {("subresources.kubevirt.io", "virtualmachineinstances/evacuate", "update"),
          ("subresources.kubevirt.io", "virtualmachineinstances/evacuate/cancel", "update")}


def test_rbac_grants_exactly_the_listed_verbs():
    docs = render()
    role = one(docs, "ClusterRole")
    # the canceller's rules are there by default; no events.k8s.io; kubedeschedulers only in the operator's namespace
    assert grants(role) == LEAST_PRIVILEGE | CANCEL
    assert all("resourceNames" not in r and "nonResourceURLs" not in r for r in role["rules"])
    assert [d for d in docs if d["kind"] in ("Role", "RoleBinding")] == []  # no cluster here: lookup finds no namespace
    checked = render(DESCHEDULER_ROLE)
    namespaced = one(checked, "Role")
    assert grants(namespaced) == DESCHEDULER_READ
    assert namespaced["metadata"]["namespace"] == "openshift-kube-descheduler-operator"
    role_binding = one(checked, "RoleBinding")
    assert role_binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                       "name": namespaced["metadata"]["name"]}
    assert role_binding["subjects"] == one(checked, "ClusterRoleBinding")["subjects"]
    assert [d for d in render(merge(DESCHEDULER_ROLE, {"deschedulerCheck": {"enabled": False}}))
            if d["kind"] == "Role"] == []
    no_history = render({"historyAnnotation": {"enabled": False}})
    # the canceller keeps the VMI patch: it removes KubeVirt's stale eviction-source annotation
    assert grants(one(no_history, "ClusterRole")) == (LEAST_PRIVILEGE - CAUSE_WRITE) | CANCEL
    neither = render({"historyAnnotation": {"enabled": False}, "cancelStuckEvacuations": {"enabled": False}})
    assert grants(one(neither, "ClusterRole")) == LEAST_PRIVILEGE - HISTORY_WRITE - CAUSE_WRITE
    assert "--no-history-annotation" in container(no_history)["args"]
    assert "--no-history-annotation" not in container(docs)["args"]
    not_cancelling = render({"cancelStuckEvacuations": {"enabled": False}})
    assert grants(one(not_cancelling, "ClusterRole")) == LEAST_PRIVILEGE
    assert "--no-cancel-stuck-evacuations" in container(not_cancelling)["args"]
    assert not any("cancel-stuck" in a for a in container(docs)["args"])  # on by default: the guard probes
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    sa = one(docs, "ServiceAccount")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": NS}]
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == sa["metadata"]["name"]
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]


# ---- the webhook configuration ------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "kind"), MATRIX)
def test_webhook_registration(mode, kind):
    docs = render(matrix_values(mode, kind))
    config = webhook_config(docs)
    assert config["kind"] == f"{kind.capitalize()}WebhookConfiguration"
    (hook,) = config["webhooks"]
    assert hook["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                              "resources": ["pods/eviction"], "scope": "Namespaced"}]
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert hook["failurePolicy"] == "Ignore"
    assert hook["timeoutSeconds"] == 5
    assert hook["admissionReviewVersions"] == ["v1", "v1beta1"]
    assert "objectSelector" not in hook
    if kind == "mutating":
        assert hook["reinvocationPolicy"] == "Never"
    else:
        assert "reinvocationPolicy" not in hook
    service = hook["clientConfig"]["service"]
    assert service == {"name": one(docs, "Service")["metadata"]["name"], "namespace": NS,
                       "path": "/mutate" if kind == "mutating" else "/validate", "port": 443}
    assert len(hook["name"].split(".")) >= 3
    (condition,) = hook["matchConditions"]
    assert condition["name"] == "virt-launcher-pods"
    assert 'object.metadata.name.startsWith("virt-launcher")' in condition["expression"]


@pytest.mark.parametrize("kind", WEBHOOK_TYPES)
def test_webhook_url_points_the_api_server_at_a_guard_outside_the_cluster(kind):
    values = merge(CERT_MODES["secret"], {"webhook": {"type": kind, "url": "https://10.0.0.5:8443/guard"}})
    docs = render(values)
    (hook,) = webhook_config(docs)["webhooks"]
    path = "/mutate" if kind == "mutating" else "/validate"
    assert hook["clientConfig"] == {"url": f"https://10.0.0.5:8443/guard{path}", "caBundle": CA_B64}
    _validate_all(docs)
    # the ServiceAccount and its RBAC stay: the guard outside runs with that ServiceAccount's token
    assert one(docs, "ClusterRoleBinding")["subjects"][0]["name"] == one(docs, "ServiceAccount")["metadata"]["name"]


@pytest.mark.parametrize("mode", ["helm", "certManager"])
def test_webhook_url_needs_the_users_own_certificate(chart, mode):
    with pytest.raises(helm.HelmError, match="webhook.url needs certificates.mode secret"):
        chart.render(merge(CERT_MODES[mode], {"webhook": {"url": "https://127.0.0.1:8443"}}), name=RELEASE,
                     namespace=NS)


@pytest.mark.parametrize("url", ["http://guard:8443", "https://guard:8443/", "https://user:pw@guard:8443",
                                 "https://guard:8443/x?a=b", "https://guard:8443#f", "guard:8443", "https://"])
def test_schema_refuses_webhook_urls_the_api_server_would_refuse(chart, url):
    with pytest.raises(helm.HelmValuesError, match="/webhook/url"):
        chart.render(merge(CERT_MODES["secret"], {"webhook": {"url": url}}), name=RELEASE, namespace=NS)


def test_mutating_is_the_default_and_the_chart_says_why():
    assert webhook_config(render())["kind"] == "MutatingWebhookConfiguration"
    source = (CHART / "templates" / "webhook.yaml").read_text()
    for fact in ("validating", "side", "parallel", "run first"):
        assert fact in source
    assert "parallel" in (CHART / "values.yaml").read_text()


def test_failure_policy_and_extra_match_conditions_are_configurable():
    extra = {"name": "not-dry-run", "expression": "!has(object.deleteOptions) || !has(object.deleteOptions.dryRun)"}
    (hook,) = webhook_config(render({"webhook": {"failurePolicy": "Fail", "extraMatchConditions": [extra]}}))["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["matchConditions"][1] == extra


MEMBER = re.compile(r"\bobject(?:\.[A-Za-z_]\w*)+")


def unguarded_accesses(expression: str) -> list[str]:
    """Member chains under `object` used before a has() of them: these error when a key is missing."""
    guarded: set[str] = set()
    problems = []
    for m in re.finditer(r"has\((object(?:\.\w+)+)\)|" + MEMBER.pattern, expression):
        if m.group(1):
            guarded.add(m.group(1))
            continue
        chain = m.group(0)
        parts = chain.split(".")
        # the last part may be a method call (startsWith...), which is not a map access
        if expression[m.end():m.end() + 1] == "(":
            parts = parts[:-1]
        for n in range(2, len(parts) + 1):
            if ".".join(parts[:n]) not in guarded:
                problems.append(".".join(parts[:n]))
    return problems


def test_cel_expressions_guard_every_map_access():
    (hook,) = webhook_config(render())["webhooks"]
    for condition in hook["matchConditions"]:
        assert unguarded_accesses(condition["expression"]) == []
    assert unguarded_accesses('object.metadata.name.startsWith("virt-launcher")') == ["object.metadata",
                                                                                      "object.metadata.name"]


def test_namespace_selector_excludes_the_guards_namespace_and_opted_out_ones():
    (hook,) = webhook_config(render())["webhooks"]
    expressions = hook["namespaceSelector"]["matchExpressions"]
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NS]} in expressions
    assert {"key": "kubevirt-eviction-guard/skip", "operator": "DoesNotExist"} in expressions
    # Helm merges maps with the defaults and replaces lists: a custom selector names its matchExpressions
    custom = {"matchLabels": {"vms": "true"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["vm"]}]}
    (hook,) = webhook_config(render({"webhook": {"namespaceSelector": custom, "excludeOwnNamespace": False}}))["webhooks"]
    assert hook["namespaceSelector"] == custom


def test_there_is_no_object_selector_value():
    with pytest.raises(helm.HelmValuesError, match="objectSelector"):
        render({"webhook": {"objectSelector": {"matchLabels": {"kubevirt.io": "virt-launcher"}}}})


def test_webhook_configuration_is_installed_last():
    """Helm orders by kind: webhook configurations last on install (first on uninstall), so an install never routes
    evictions to a guard whose Service, RBAC and Deployment do not exist yet."""
    with helm.Config(kube_apiserver="http://127.0.0.1:9", kube_token="unused", namespace=NS,
                     storage_driver="memory") as cfg, helm.Chart.load(CHART) as c:
        release = cfg.install(c, RELEASE, {}, namespace=NS, dry_run="client")
    kinds = re.findall(r"^kind: (\w+)$", release["manifest"], re.M)
    # after it only the kinds Helm does not order (the admission policy for the guard's own writes)
    last = kinds.index("MutatingWebhookConfiguration")
    assert set(kinds[last + 1:]) <= {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    assert kinds.index("Deployment") < last


# ---- the uninstall hook ----------------------------------------------------------------------------

HOOK = {"uninstallHook": {"enabled": True}}


def hook_objects(docs: list[dict]) -> dict[str, dict]:
    return {d["kind"]: d for d in docs if "helm.sh/hook" in (d["metadata"].get("annotations") or {})}


def test_the_uninstall_hook_renders_only_for_helm_3_unless_asked():
    """auto: only when Helm 3 renders (this engine is Helm 4's, which deletes webhook configurations first)."""
    assert hook_objects(render()) == {}
    assert hook_objects(render({"uninstallHook": {"enabled": False}})) == {}
    assert set(hook_objects(render(HOOK))) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Job"}


@pytest.mark.parametrize("kind", WEBHOOK_TYPES)
def test_the_uninstall_hook_deletes_only_the_releases_webhook_configuration_before_anything_else(kind):
    docs = render(merge(HOOK, {"webhook": {"type": kind}}))
    hooks = hook_objects(docs)
    _validate_all(list(hooks.values()))
    for d in hooks.values():
        assert d["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    weight = {k: int(d["metadata"]["annotations"]["helm.sh/hook-weight"]) for k, d in hooks.items()}
    assert max(weight[k] for k in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")) < weight["Job"]
    policies = {k: set(d["metadata"]["annotations"]["helm.sh/hook-delete-policy"].split(",")) for k, d in hooks.items()}
    assert all({"before-hook-creation", "hook-succeeded"} <= p for p in policies.values())
    assert "hook-failed" in policies["Job"]  # and Helm deletes the succeeded RBAC hooks when a later hook fails
    # RBAC: delete, on that one object, and nothing else
    target = webhook_config(docs)
    assert grants(hooks["ClusterRole"]) == {("admissionregistration.k8s.io", f"{kind}webhookconfigurations", "delete")}
    (rule,) = hooks["ClusterRole"]["rules"]
    assert rule["resourceNames"] == [target["metadata"]["name"]]
    binding = hooks["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == hooks["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": hooks["ServiceAccount"]["metadata"]["name"],
                                    "namespace": NS}]
    # the Job: the guard's image, its own command line, the Deployment's hardening, a deadline
    job = hooks["Job"]["spec"]
    pod = job["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == container(docs)["image"] and c["command"] == ["kubevirt-eviction-guard"]
    args = build_parser().parse_args(c["args"])
    assert (args.command, args.kind, args.name) == ("unregister", kind, target["metadata"]["name"])
    assert args.kubeconfig is None  # in-cluster: the hook's own ServiceAccount
    assert pod["serviceAccountName"] == hooks["ServiceAccount"]["metadata"]["name"]
    deployment = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == deployment["securityContext"]
    assert c["securityContext"] == container(docs)["securityContext"]
    assert c["securityContext"]["readOnlyRootFilesystem"] and c["securityContext"]["runAsNonRoot"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["restartPolicy"] == "Never" and job["activeDeadlineSeconds"] == 60 and args.timeout < 60
    # its pod is none of the guard's: not behind the Service, not counted by the PDB, not under the NetworkPolicy
    labels = job["template"]["metadata"]["labels"]
    for selector in (one(docs, "Service")["spec"]["selector"],
                     one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
                     one(docs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"]):
        assert not selector.items() <= labels.items(), selector
    assert labels["app.kubernetes.io/instance"] == RELEASE


def test_the_uninstall_hooks_deadline_is_a_value():
    job = hook_objects(render(merge(HOOK, {"uninstallHook": {"activeDeadlineSeconds": 120}})))["Job"]["spec"]
    (c,) = job["template"]["spec"]["containers"]
    assert job["activeDeadlineSeconds"] == 120
    assert build_parser().parse_args(c["args"]).timeout == 115
    with pytest.raises(helm.HelmValuesError, match="activeDeadlineSeconds"):
        render(merge(HOOK, {"uninstallHook": {"activeDeadlineSeconds": 0}}))
    with pytest.raises(helm.HelmValuesError, match="enabled"):
        render({"uninstallHook": {"enabled": "sometimes"}})


# ---- certificates ----------------------------------------------------------------------------------


def tls_volume(docs: list[dict]) -> str:
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    (tls,) = [v for v in volumes if v["name"] == "tls"]
    mount = next(m for m in container(docs)["volumeMounts"] if m["name"] == "tls")
    assert "subPath" not in mount, "a subPath mount never sees rotated certificates"
    return tls["secret"]["secretName"]


def verify_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> None:
    key = ca.public_key()
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(cert.signature, cert.tbs_certificate_bytes, padding.PKCS1v15(), cert.signature_hash_algorithm)
    else:
        key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))


def service_dns(docs: list[dict]) -> str:
    return f"{one(docs, 'Service')['metadata']['name']}.{NS}.svc"


def test_helm_mode_generates_a_ca_and_a_serving_certificate_for_the_service():
    docs = render({"certificates": {"mode": "helm"}})
    secret = one(docs, "Secret")
    assert secret["type"] == "kubernetes.io/tls" and tls_volume(docs) == secret["metadata"]["name"]
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    verify_signed_by(cert, ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert service_dns(docs) in sans and f"{service_dns(docs)}.cluster.local" in sans
    assert cert.not_valid_after_utc - dt.datetime.now(dt.timezone.utc) > dt.timedelta(days=3000)
    (hook,) = webhook_config(docs)["webhooks"]
    assert hook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]


def test_helm_generated_certificates_are_stable_across_upgrades_via_lookup():
    """Rendered cluster-aware (Helm's lookup against a fake API server over HTTP): an existing Secret is reused."""
    with FakeApiServer() as api, helm.Chart.load(CHART) as c:
        with helm.Config(kube_apiserver=api.url, kube_token="fake-token", namespace=NS) as cfg:
            install = docs_of(cfg.render(c, {}, name=RELEASE, namespace=NS, is_install=True))
            secret = one(install, "Secret")
            api.put(secret)  # what `helm install` created
            upgrade = docs_of(cfg.render(c, {"replicaCount": 3}, name=RELEASE, namespace=NS, is_upgrade=True))
        looked_up = [r for r in api.requests if r.path == f"/api/v1/namespaces/{NS}/secrets/{secret['metadata']['name']}"]
    assert len(looked_up) == 2 and [r.status for r in looked_up] == [404, 200]
    assert one(upgrade, "Secret")["data"] == secret["data"]
    assert webhook_config(upgrade)["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    # without a cluster every render generates a new CA: the stability really comes from lookup
    assert one(render(), "Secret")["data"]["ca.crt"] != secret["data"]["ca.crt"]


def _certs(bundle_b64: str) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(base64.b64decode(bundle_b64))


def test_a_new_ca_is_trusted_beside_the_previous_one_until_the_next_upgrade():
    """Rotation (the Secret deleted, then an upgrade): the caBundle holds the new CA and the one the webhook
    configuration had first, so the API server trusts the pods' old pair until they serve the new one. The next
    upgrade drops the old CA; a second rotation keeps one previous CA, never more."""
    with FakeApiServer() as api, helm.Chart.load(CHART) as c:
        with helm.Config(kube_apiserver=api.url, kube_token="fake-token", namespace=NS) as cfg:
            def upgrade(values: dict | None = None) -> tuple[dict, dict]:
                docs = docs_of(cfg.render(c, values or {}, name=RELEASE, namespace=NS, is_upgrade=True))
                secret, hook = one(docs, "Secret"), webhook_config(docs)
                api.put(secret)
                api.put(hook)
                return secret, hook

            def bundle(hook: dict) -> list[x509.Certificate]:
                return _certs(hook["webhooks"][0]["clientConfig"]["caBundle"])

            first, hook = upgrade()
            assert [c.serial_number for c in bundle(hook)] == [_certs(first["data"]["ca.crt"])[0].serial_number]
            api.delete("Secret", NS, first["metadata"]["name"])
            second, hook = upgrade()
            new, old = (_certs(s["data"]["ca.crt"])[0] for s in (second, first))
            assert new != old and _certs(second["data"]["ca.crt"]) == [new]  # the pods' Secret: the new CA alone
            assert bundle(hook) == [new, old]
            assert verify_signed_by(x509.load_pem_x509_certificate(base64.b64decode(first["data"]["tls.crt"])),
                                    bundle(hook)[1]) is None
            kept, hook = upgrade({"replicaCount": 3})
            assert kept["data"] == second["data"] and bundle(hook) == [new]
            api.delete("Secret", NS, kept["metadata"]["name"])
            third, hook = upgrade()
            api.delete("Secret", NS, third["metadata"]["name"])
            fourth, hook = upgrade()
            assert bundle(hook) == [_certs(fourth["data"]["ca.crt"])[0], _certs(third["data"]["ca.crt"])[0]]
            # the webhook type changed with the rotation: no configuration of that kind to take a CA from
            api.delete("Secret", NS, fourth["metadata"]["name"])
            docs = docs_of(cfg.render(c, {"webhook": {"type": "validating"}}, name=RELEASE, namespace=NS,
                                      is_upgrade=True))
            assert len(_certs(webhook_config(docs)["webhooks"][0]["clientConfig"]["caBundle"])) == 1


def test_cert_manager_mode_issues_a_certificate_and_injects_the_ca():
    docs = render({"certificates": {"mode": "certManager"}})
    assert not [d for d in docs if d["kind"] == "Secret"]
    certs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    issuers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Issuer"}
    for d in (*certs.values(), *issuers.values()):
        assert d["apiVersion"] == "cert-manager.io/v1" and d["metadata"]["namespace"] == NS
    serving = certs[f"{FULLNAME}-serving"]["spec"]
    assert serving["secretName"] == tls_volume(docs)
    assert service_dns(docs) in serving["dnsNames"] and serving["commonName"] == service_dns(docs)
    assert "server auth" in serving["usages"]
    assert serving["issuerRef"] == {"name": f"{FULLNAME}-ca", "kind": "Issuer", "group": "cert-manager.io"}
    assert certs[f"{FULLNAME}-ca"]["spec"]["isCA"] is True
    assert certs[f"{FULLNAME}-ca"]["spec"]["issuerRef"]["name"] == f"{FULLNAME}-selfsigned"
    assert issuers[f"{FULLNAME}-selfsigned"]["spec"] == {"selfSigned": {}}
    assert issuers[f"{FULLNAME}-ca"]["spec"] == {"ca": {"secretName": f"{FULLNAME}-ca"}}
    config = webhook_config(docs)
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NS}/{FULLNAME}-serving"
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]


def test_cert_manager_with_an_existing_issuer_creates_no_issuers():
    docs = render(CERT_MODES["certManager-issuer"])
    assert not [d for d in docs if d["kind"] == "Issuer"]
    (cert,) = [d for d in docs if d["kind"] == "Certificate"]
    assert cert["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}


def test_secret_mode_mounts_the_given_secret_and_uses_the_given_ca():
    docs = render(CERT_MODES["secret"])
    assert not [d for d in docs if d["kind"] in ("Secret", "Certificate", "Issuer")]
    assert tls_volume(docs) == "my-tls"
    assert webhook_config(docs)["webhooks"][0]["clientConfig"]["caBundle"] == CA_B64
    with pytest.raises(helm.HelmValuesError, match="caBundle"):
        render({"certificates": {"mode": "secret", "secret": {"name": "my-tls", "caBundle": ""}}})


# ---- monitoring ------------------------------------------------------------------------------------


def guard_metric_names() -> set[str]:
    """Every series name the guard exports (families expanded to their sample names)."""
    registry = CollectorRegistry()
    Metrics(registry)
    ReloadMetrics(registry)
    DeschedulerCheck(client.ApiClient(), registry)
    names = set()
    for family in registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}.get(family.type, ("",))
        names |= {family.name + s for s in suffixes}
    return names


def test_monitoring_is_off_by_default():
    assert not {d["kind"] for d in render()} & {"ServiceMonitor", "PrometheusRule"}


def test_service_monitor_scrapes_the_metrics_port():
    docs = render(MONITORING)
    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["selector"]["matchLabels"].items() <= one(docs, "Service")["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics" and endpoint["scheme"] == "http"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NS]}


def test_prometheus_rule_alerts_on_what_the_guard_exports():
    rule = one(render(MONITORING), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    (group,) = rule["spec"]["groups"]
    alerts = {r["alert"]: r for r in group["rules"]}
    assert set(alerts) == {
        "KubevirtEvictionGuardNodeBlockingSustained", "KubevirtEvictionGuardCooldownPinnedAtMaximum",
        "KubevirtEvictionGuardNotReady", "KubevirtEvictionGuardWatchRestartsClimbing",
        "KubevirtEvictionGuardDeschedulerMisconfigured", "KubevirtEvictionGuardCertificateExpiring",
        "KubevirtEvictionGuardDown", "KubevirtEvictionGuardFailingOpen",
        "KubevirtEvictionGuardNodeHeld", "KubevirtEvictionGuardDeschedulerNodeLimitAboveKubeVirt",
        "KubevirtEvictionGuardEvacuationFailing",
    }
    # the API server's count of calls it could not make and let through (tests/test_chart_refusals.py)
    failing_open = alerts.pop("KubevirtEvictionGuardFailingOpen")
    assert "apiserver_admission_webhook_fail_open_count{name=" in failing_open["expr"]
    exported = guard_metric_names() | {"up"}
    for name, alert in alerts.items():
        assert alert["labels"]["severity"] and alert["annotations"]["summary"] and alert["for"]
        expr = alert["expr"]
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), name
        used = set(re.findall(r"\b([a-z_:][a-z0-9_:]*)\s*\{", expr))
        assert used and used <= exported, f"{name} uses series the guard does not export: {used - exported}"
        assert f'job="{FULLNAME}"' in expr and f'namespace="{NS}"' in expr, name
    assert 'state="disabled"' in alerts["KubevirtEvictionGuardDeschedulerMisconfigured"]["expr"]
    fix = alerts["KubevirtEvictionGuardDeschedulerMisconfigured"]["annotations"]["description"]
    assert "KubeVirtRelieveAndMigrate" in fix and "devEnableEvictionsInBackground: true" in fix  # names the fix
    assert "openshift-kube-descheduler-operator" in fix
    assert 'le="14400.0"' in alerts["KubevirtEvictionGuardCooldownPinnedAtMaximum"]["expr"]  # Python's le spelling
    assert "by (node)" in alerts["KubevirtEvictionGuardNodeBlockingSustained"]["expr"]
    assert "kubevirt_eviction_guard_held_nodes" in alerts["KubevirtEvictionGuardNodeHeld"]["expr"]
    held = alerts["KubevirtEvictionGuardNodeHeld"]["annotations"]["description"]
    assert "virtctl evacuate-cancel" in held and "reason=NodeHeld" in held  # names the fix and where to look
    assert 'node_limit_above_kubevirt="true"' in alerts["KubevirtEvictionGuardDeschedulerNodeLimitAboveKubeVirt"]["expr"]


def test_alerts_can_be_switched_off_one_by_one():
    (every,) = one(render(MONITORING), "PrometheusRule")["spec"]["groups"]
    values = merge(MONITORING, {"metrics": {"prometheusRule": {"rules": {"cooldownPinned": {"enabled": False}}}}})
    (group,) = one(render(values), "PrometheusRule")["spec"]["groups"]
    assert {r["alert"] for r in every["rules"]} - {r["alert"] for r in group["rules"]} == {
        "KubevirtEvictionGuardCooldownPinnedAtMaximum"}


# ---- values.schema.json ----------------------------------------------------------------------------


def leaf_paths(value, prefix=()):
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from leaf_paths(v, (*prefix, k))
    else:
        yield prefix


def schema_at(schema: dict, path: tuple[str, ...]) -> dict | None:
    node = schema
    for key in path:
        props = node.get("properties") or {}
        if key in props:
            node = props[key]
        elif node.get("type") == "object" and "properties" not in node:
            return node  # a Kubernetes structure passed through whole (the API server validates it)
        else:
            return None
    return node


def test_schema_declares_every_value():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    undeclared = [".".join(p) for p in leaf_paths(values) if schema_at(schema, p) is None]
    assert undeclared == []

    def closed(node: dict, where: str) -> None:
        if "properties" in node:
            assert node.get("additionalProperties") is False, f"{where} accepts unknown keys"
            for k, v in node["properties"].items():
                closed(v, f"{where}.{k}")

    closed(schema, "values")


@pytest.mark.parametrize(("values", "complaint"), [
    ({"webhook": {"type": "both"}}, "/webhook/type"),
    ({"webhook": {"failurePolicy": "Sometimes"}}, "/webhook/failurePolicy"),
    ({"webhook": {"timeoutSeconds": 31}}, "/webhook/timeoutSeconds"),
    ({"certificates": {"mode": "vault"}}, "/certificates/mode"),
    ({"policy": {"migrationCooldown": "15 minutes"}}, "/policy/migrationCooldown"),
    ({"policy": {"cooldownScope": "some"}}, "/policy/cooldownScope"),
    ({"policy": {"pendingEvacuationsPerNode": -1}}, "/policy/pendingEvacuationsPerNode"),
    ({"policy": {"honorPreferNoEviction": "yes"}}, "/policy/honorPreferNoEviction"),
    ({"replicaCount": 0}, "/replicaCount"),
    ({"podAntiAffinity": "maybe"}, "/podAntiAffinity"),
    ({"server": {"port": 70000}}, "/server/port"),
    ({"metrics": {"prometheusRule": {"rules": {"cooldownPinned": {"aboveSeconds": 1000}}}}}, "aboveSeconds"),
    ({"replicas": 2}, "replicas"),
])
def test_schema_rejects_bad_values_naming_them(chart, values, complaint):
    with pytest.raises(helm.HelmValuesError, match=re.escape(complaint)):
        chart.render(values, name=RELEASE, namespace=NS)


# ---- steering: Prometheus URL, token, CA ----------------------------------------------------------

OPENSHIFT_PROMETHEUS = {"prometheus": {"url": "https://thanos-querier.openshift-monitoring.svc:9091",
                                       "token": {"source": "readerServiceAccount"},
                                       "ca": {"source": "serviceAccount"}, "clusterMonitoringView": True}}
SECRET_PROMETHEUS = {"prometheus": {"url": "https://prometheus.monitoring.svc:9090", "interval": "15s", "maxAge": "1m",
                                    "token": {"source": "secret", "secret": {"name": "prom-token", "key": "t"}},
                                    "ca": {"source": "configMap", "name": "prom-ca", "key": "ca.pem"}}}


def helm_notes(values: dict) -> str:
    with helm.Chart.load(CHART) as c:
        rendered = c.render(values, name=RELEASE, namespace=NS)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def _validate_all(docs: list[dict]) -> None:
    for doc in docs:
        if doc["kind"] not in CRD_KINDS:
            for version in KUBE_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)


def test_steering_finds_the_descheduler_s_prometheus_by_default():
    args = build_parser().parse_args(["serve", *container(render())["args"]])
    assert (args.steering, args.prometheus_url, args.prometheus_token_file) == ("auto", None, None)
    assert args.descheduler_policy == "openshift-kube-descheduler-operator/cluster,kube-system/descheduler"
    assert [d for d in render() if d["kind"] == "ClusterRoleBinding"] == [one(render(), "ClusterRoleBinding")]
    assert [d for d in render() if d["kind"] in ("Role", "RoleBinding")] == []  # no cluster here: lookup finds none


POLICY_ROLES = {"prometheus": {"discovery": {"createRoles": "always"}}}


def _policy_roles(docs: list[dict]) -> dict[str, list[dict]]:
    return {d["metadata"]["namespace"]: d["rules"] for d in docs
            if d["kind"] == "Role" and d["metadata"]["name"].endswith("-descheduler-policy")}


def test_discovery_may_read_the_named_policy_configmaps_and_nothing_else():
    docs = render(POLICY_ROLES)
    _validate_all(docs)
    assert _policy_roles(docs) == {
        "openshift-kube-descheduler-operator": [{"apiGroups": [""], "resources": ["configmaps"],
                                                 "resourceNames": ["cluster"], "verbs": ["get"]}],
        "kube-system": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["descheduler"],
                         "verbs": ["get"]}]}
    bindings = [d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"].endswith("-descheduler-policy")]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["kube-system", "openshift-kube-descheduler-operator"]
    assert {b["subjects"][0]["name"] for b in bindings} == {one(docs, "ServiceAccount")["metadata"]["name"]}


def test_the_policy_s_token_secret_is_granted_by_name_only_when_named():
    docs = render(merge(POLICY_ROLES, {"prometheus": {"discovery": {
        "authTokenSecret": {"namespace": "kube-system", "name": "prom-token"}}}}))
    rules = _policy_roles(docs)["kube-system"]
    assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["prom-token"], "verbs": ["get"]} in rules
    elsewhere = render(merge(POLICY_ROLES, {"prometheus": {"discovery": {
        "authTokenSecret": {"namespace": "ds", "name": "prom-token"}}}}))
    # a namespace with only the Secret: no ConfigMap rule (an empty resourceNames would grant them all)
    assert _policy_roles(elsewhere)["ds"] == [{"apiGroups": [""], "resources": ["secrets"],
                                               "resourceNames": ["prom-token"], "verbs": ["get"]}]
    assert not any(r["resources"] == ["secrets"] for rules in _policy_roles(render(POLICY_ROLES)).values() for r in rules)


@pytest.mark.parametrize("values, steering, policy", [
    ({"prometheus": {"steering": "off"}}, "off", None),
    ({"prometheus": {"discovery": {"policyConfigMaps": []}}}, "auto", ""),
    ({"prometheus": {"url": "https://prom:9090"}}, "auto", None),
])
def test_steering_off_or_without_discovery_grants_no_policy_read(values, steering, policy):
    docs = render(merge(POLICY_ROLES, values))
    args = build_parser().parse_args(["serve", *container(docs)["args"]])
    assert (args.steering, args.descheduler_policy) == (steering, policy)
    assert _policy_roles(docs) == {}


@pytest.mark.parametrize("values, message", [
    ({"prometheus": {"steering": "off", "url": "https://prom:9090"}}, "prometheus.steering: off contradicts"),
    ({"prometheus": {"discovery": {"authTokenSecret": {"namespace": "ds", "name": ""}}}},
     "authTokenSecret: needs both namespace and name"),
])
def test_contradicting_steering_values_are_refused(values, message):
    with pytest.raises(helm.HelmError, match=message):
        render(values)


@pytest.mark.parametrize("values", [
    {"prometheus": {"steering": "on"}},
    {"prometheus": {"discovery": {"policyConfigMaps": [{"namespace": "kube-system"}]}}},
    {"prometheus": {"discovery": {"policyConfigMaps": [{"namespace": "Kube", "name": "x"}]}}},
])
def test_bad_discovery_values_fail_the_schema(values):
    with pytest.raises(helm.HelmError):
        render(values)


def test_openshift_thanos_querier_values():
    docs = render(OPENSHIFT_PROMETHEUS)
    _validate_all(docs)
    args = build_parser().parse_args(["serve", *container(docs)["args"]])
    assert args.prometheus_url == "https://thanos-querier.openshift-monitoring.svc:9091"
    # the token of a ServiceAccount that can read metrics and nothing else, never the guard's own
    reader = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"].endswith("-metrics-reader")]
    assert len(reader) == 1
    secret = next(d for d in docs if d["kind"] == "Secret" and d["type"] == "kubernetes.io/service-account-token")
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == reader[0]["metadata"]["name"]
    mounts = {m["name"]: m["mountPath"] for m in container(docs)["volumeMounts"]}
    volumes = {v["name"]: v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert args.prometheus_token_file == f"{mounts['prometheus-token']}/token"
    assert volumes["prometheus-token"]["secret"]["secretName"] == secret["metadata"]["name"]
    assert "serviceaccount/token" not in " ".join(container(docs)["args"])
    assert args.prometheus_ca == "/var/run/secrets/kubernetes.io/serviceaccount/service-ca.crt"
    assert args.prometheus_interval == "30s" and args.prometheus_max_age is None
    view = [d for d in docs if d["kind"] == "ClusterRoleBinding" and d["roleRef"]["name"] == "cluster-monitoring-view"]
    assert len(view) == 1 and view[0]["subjects"][0]["name"] == reader[0]["metadata"]["name"]
    assert "9091" in helm_notes(OPENSHIFT_PROMETHEUS)


def test_token_secret_and_ca_configmap_are_mounted():
    docs = render(SECRET_PROMETHEUS)
    _validate_all(docs)
    c = container(docs)
    args = build_parser().parse_args(["serve", *c["args"]])
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert args.prometheus_token_file == f"{mounts['prometheus-token']}/t"
    assert args.prometheus_ca == f"{mounts['prometheus-ca']}/ca.pem"
    assert (args.prometheus_interval, args.prometheus_max_age) == ("15s", "1m")
    volumes = {v["name"]: v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["prometheus-token"]["secret"]["secretName"] == "prom-token"
    assert volumes["prometheus-ca"]["configMap"]["name"] == "prom-ca"


def test_policy_steering_values_reach_the_config_file(tmp_path):
    docs = render({"policy": {"steeringMinGain": 8, "steeringMargin": 2.5}})
    (tmp_path / "config.yaml").write_text(one(docs, "ConfigMap")["data"]["config.yaml"])
    settings = build_settings(load_config_file(tmp_path / "config.yaml"))
    assert (settings.steering_min_gain, settings.steering_margin) == (8, 2.5)


# ---- who may connect, and what a leaked token can do ----------------------------------------------


def test_a_network_policy_admits_the_webhook_port_from_anywhere_and_metrics_from_monitoring_by_default():
    docs = render()
    policy = one(docs, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    webhook, metrics = policy["spec"]["ingress"]
    assert webhook == {"ports": [{"port": "https", "protocol": "TCP"}]}  # no `from`: the API server's addresses vary
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    [peer] = metrics["from"]
    assert "openshift-monitoring" in peer["namespaceSelector"]["matchExpressions"][0]["values"]
    control_plane = [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    webhook, _ = one(render({"networkPolicy": {"webhook": {"from": control_plane}}}), "NetworkPolicy")["spec"]["ingress"]
    assert webhook["from"] == control_plane
    _validate_all(render({"networkPolicy": {"webhook": {"from": control_plane}}}))
    assert [d for d in render({"networkPolicy": {"enabled": False}}) if d["kind"] == "NetworkPolicy"] == []


@pytest.mark.parametrize("source", ["secret", "configMap"])
def test_client_ca_value_turns_on_client_certificates(source):
    assert build_parser().parse_args(["serve", *container(render())["args"]]).client_ca is None
    docs = render({"clientCA": {"source": source, "name": "apiserver-client-ca", "key": "ca.pem"}})
    _validate_all(docs)
    c = container(docs)
    args = build_parser().parse_args(["serve", *c["args"]])
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert args.client_ca == f"{mounts['client-ca']}/ca.pem"
    volume = next(v for v in one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == "client-ca")
    assert (volume.get("secret") or {}).get("secretName", (volume.get("configMap") or {}).get("name")) == "apiserver-client-ca"
    assert c["readinessProbe"]["httpGet"]["port"] == "https"  # probes need no client certificate, even so
    with pytest.raises(helm.HelmError, match="clientCA.name is required"):
        render({"clientCA": {"source": source}})


def test_an_http_prometheus_url_with_a_token_is_refused():
    for source in ("secret", "readerServiceAccount"):
        values = {"prometheus": {"url": "http://prometheus.monitoring.svc:9090",
                                 "token": {"source": source, "secret": {"name": "t", "key": "token"}}}}
        with pytest.raises(helm.HelmError, match=r"prometheus.url: must be https:// when prometheus.token.source"):
            render(values)
    plain = container(render({"prometheus": {"url": "http://prometheus.monitoring.svc:9090"}}))  # no token: fine
    assert build_parser().parse_args(["serve", *plain["args"]]).prometheus_token_file is None


@pytest.mark.parametrize(("values", "expected"), [
    ({}, 512),  # 384Mi: half of it at ~384 KiB a connection
    ({"resources": {"limits": {"memory": "1Gi"}}}, 1365),
    ({"resources": {"limits": {"memory": "400M"}}}, 508),
    ({"resources": {"limits": {"memory": "402653184"}}}, 512),
    ({"resources": {"limits": {"memory": "5Mi"}}}, 8),
    ({"server": {"maxConnections": 100}}, 100),
    ({"resources": {"limits": None}}, None),  # no limit: the guard's own default
])
def test_the_connection_cap_is_sized_from_the_memory_limit(values, expected):
    args = build_parser().parse_args(["serve", *container(render(values))["args"]])
    assert args.max_connections == (expected if expected is not None else build_parser().parse_args(
        ["serve", "--tls-cert", "c", "--tls-key", "k"]).max_connections)


def test_bounds_on_clients_reach_the_guards_flags():
    args = build_parser().parse_args(["serve", *container(render({"server": {
        "maxBodyBytes": 32768, "maxHeaderBytes": 8192, "maxHeaders": 50, "tlsHandshakeTimeout": "5s"}}))["args"]])
    assert (args.max_body_bytes, args.max_header_bytes, args.max_headers, args.tls_handshake_timeout) == (
        32768, 8192, 50, "5s")
    defaults = build_parser().parse_args(["serve", *container(render())["args"]])
    own = build_parser().parse_args(["serve", "--tls-cert", "c", "--tls-key", "k"])
    for flag in ("max_body_bytes", "max_header_bytes", "max_headers", "tls_handshake_timeout"):
        assert getattr(defaults, flag) == getattr(own, flag), flag  # the chart's defaults are the guard's


# The ValidatingAdmissionPolicy's CEL, evaluated by cel-python (the API server's cel-go is what runs it in a
# cluster; the end-to-end tests run it there) against pairs of objects as a PATCH by the guard reaches admission.
EIP_KEY = "descheduler.alpha.kubernetes.io/eviction-in-progress"
HISTORY_KEY = "kubevirt-eviction-guard.io/migration-history"
GUARD_USER = f"system:serviceaccount:{NS}:{FULLNAME}"


def pod_pair(**new_changes) -> tuple[dict, dict]:
    old = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "virt-launcher-db-x", "namespace": "vms", "uid": "u1", "resourceVersion": "10",
                        "labels": {"kubevirt.io": "virt-launcher"}, "annotations": {"kubevirt.io/domain": "db"},
                        "ownerReferences": [{"kind": "VirtualMachineInstance", "name": "db", "uid": "v1"}],
                        "managedFields": [{"manager": "virt-controller"}]},
           "spec": {"nodeName": "node-a", "containers": [{"name": "compute", "image": "virt-launcher:v1"}]},
           "status": {"phase": "Running"}}
    new = json.loads(json.dumps(old))
    new["metadata"]["resourceVersion"] = "11"  # the API server's own changes on every write
    new["metadata"]["managedFields"].append({"manager": "kubevirt-eviction-guard"})
    for path, value in new_changes.items():
        *parents, last = path.split("__")
        target = new
        for part in parents:
            target = target.setdefault(part, {})
        if value is None:
            target.pop(last, None)
        else:
            target[last] = value
    return old, new


def vap_verdict(old: dict, new: dict, resource: str, user: str = GUARD_USER) -> list[str] | None:
    """None when the policy does not apply (not the guard); else the messages of the failed validations."""
    import celpy

    spec = one(render(), "ValidatingAdmissionPolicy")["spec"]
    env = celpy.Environment()

    def run(expression: str, activation: dict):
        return env.program(env.compile(expression)).evaluate(activation)

    activation = {"request": celpy.json_to_cel({"resource": {"resource": resource}, "userInfo": {"username": user}}),
                  "object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old)}
    if not all(run(c["expression"], activation) for c in spec["matchConditions"]):
        return None
    variables = {}
    for var in spec["variables"]:
        variables[var["name"]] = run(var["expression"], {**activation, "variables": celpy.celtypes.MapType(variables)})
    activation["variables"] = celpy.celtypes.MapType(variables)
    failed = []
    for rule in spec["validations"]:
        if not run(rule["expression"], activation):
            failed.append(str(run(rule["messageExpression"], activation)) if "messageExpression" in rule else rule["message"])
    return failed


@pytest.mark.parametrize(("changes", "allowed"), [
    ({f"metadata__annotations__{EIP_KEY}": "kubevirt-eviction-guard"}, True),  # what the guard writes
    ({"metadata__annotations": None}, False),  # dropping kubevirt.io/domain too
    ({"spec__containers": [{"name": "compute", "image": "evil:latest"}]}, False),
    ({"metadata__labels__kubevirt.io": "not-a-launcher"}, False),
    ({"metadata__labels__extra": "x"}, False),
    ({"metadata__annotations__kubevirt.io/domain": "other"}, False),
    ({f"metadata__annotations__{HISTORY_KEY}": "[]"}, False),  # the VMI's annotation is not the pod's
    ({"metadata__ownerReferences": []}, False),
    ({"metadata__finalizers": ["x"]}, False),
    ({"status__phase": "Failed"}, False),
])
def test_the_admission_policy_lets_the_guard_change_only_its_annotation_on_a_pod(changes, allowed):
    old, new = pod_pair(**changes)
    assert (vap_verdict(old, new, "pods") == []) is allowed
    old_marked = json.loads(json.dumps(new))  # and taking the annotation off again
    if allowed:
        assert vap_verdict(old_marked, old, "pods") == []
    assert vap_verdict(old, new, "pods", user="system:serviceaccount:kube-system:descheduler") is None  # others: n/a


def test_the_admission_policy_lets_the_guard_change_only_the_history_annotation_on_a_vmi():
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": "db", "namespace": "vms", "resourceVersion": "5", "annotations": {"a": "b"}},
           "spec": {"domain": {"cpu": {"cores": 2}}}, "status": {"nodeName": "node-a"}}
    history = json.loads(json.dumps(vmi))
    history["metadata"]["annotations"][HISTORY_KEY] = '[{"end":"2026-11-21T12:00:00Z"}]'
    history["metadata"]["resourceVersion"] = "6"
    assert vap_verdict(vmi, history, "virtualmachineinstances") == []
    eip = json.loads(json.dumps(vmi))
    eip["metadata"]["annotations"][EIP_KEY] = "x"
    assert vap_verdict(vmi, eip, "virtualmachineinstances") == [f"kubevirt-eviction-guard may change no annotation but {HISTORY_KEY}"]
    # KubeVirt's eviction-source: removed from an unmarked VMI (stale), never from a marked one, never added
    src = json.loads(json.dumps(vmi))
    src["metadata"]["annotations"]["kubevirt.io/eviction-source"] = "descheduler"
    assert vap_verdict(src, vmi, "virtualmachineinstances") == []
    marked = json.loads(json.dumps(src))
    marked["status"]["evacuationNodeName"] = "node-a"
    unmarked = json.loads(json.dumps(vmi))
    unmarked["status"]["evacuationNodeName"] = "node-a"
    assert vap_verdict(marked, unmarked, "virtualmachineinstances") == [
        f"kubevirt-eviction-guard may change no annotation but {HISTORY_KEY}"]
    assert vap_verdict(vmi, src, "virtualmachineinstances") == [
        f"kubevirt-eviction-guard may change no annotation but {HISTORY_KEY}"]
    other = json.loads(json.dumps(src))
    other["metadata"]["annotations"]["kubevirt.io/eviction-source"] = "someone"
    assert vap_verdict(other, vmi, "virtualmachineinstances") == [
        f"kubevirt-eviction-guard may change no annotation but {HISTORY_KEY}"]
    cores = json.loads(json.dumps(history))
    cores["spec"]["domain"]["cpu"]["cores"] = 64
    assert vap_verdict(vmi, cores, "virtualmachineinstances") == ["kubevirt-eviction-guard may not change spec or status"]


def test_the_admission_policy_marks_what_it_judged_in_the_audit_log():
    import celpy

    spec = one(render(), "ValidatingAdmissionPolicy")["spec"]
    (annotation,) = spec["auditAnnotations"]
    assert annotation["key"] == "judged"
    env = celpy.Environment()
    for allowed in (EIP_KEY, HISTORY_KEY):
        value = env.program(env.compile(annotation["valueExpression"])).evaluate(
            {"variables": celpy.celtypes.MapType({celpy.celtypes.StringType("allowed"): celpy.celtypes.StringType(allowed)})})
        assert str(value) == f"may change {allowed} only"


def test_the_admission_policy_is_bound_and_matches_the_guards_writes():
    docs = render()
    policy, binding = one(docs, "ValidatingAdmissionPolicy"), one(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["operations"]))
             for r in policy["spec"]["matchConstraints"]["resourceRules"]}
    assert rules == {(("",), ("pods",), ("UPDATE",)), (("kubevirt.io",), ("virtualmachineinstances",), ("UPDATE",)),
                     (("kubevirt.io",), ("virtualmachineinstancemigrations",), ("UPDATE",))}
    assert GUARD_USER == f"system:serviceaccount:{NS}:{one(docs, 'ServiceAccount')['metadata']['name']}"
    assert [d for d in render({"validatingAdmissionPolicy": {"enabled": False}})
            if d["kind"].startswith("ValidatingAdmissionPolicy")] == []


CAUSE_KEY = "kubevirt-eviction-guard.io/cause"


def vmim_pair(annotations: dict, spec: dict | None = None) -> tuple[dict, dict]:
    old = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
           "metadata": {"name": "kubevirt-evacuation-x", "namespace": "vms", "uid": "m1", "resourceVersion": "5",
                        "annotations": {"kubevirt.io/evacuationMigration": "node-a"},
                        "labels": {"kubevirt.io/vmi-name": "db"}},
           "spec": {"vmiName": "db"}, "status": {"phase": "Running"}}
    new = json.loads(json.dumps(old))
    new["metadata"]["resourceVersion"] = "6"
    new["metadata"]["annotations"].update(annotations)
    if spec is not None:
        new["spec"] = spec
    return old, new


@pytest.mark.parametrize(("annotations", "spec", "allowed"), [
    ({CAUSE_KEY: "descheduler"}, None, True),  # what the cause recorder writes
    ({HISTORY_KEY: "[]"}, None, False),  # the VMI's annotation is not the VMIM's
    ({"kubevirt.io/evacuationMigration": "node-b"}, None, False),
    ({CAUSE_KEY: "descheduler"}, {"vmiName": "other"}, False),
])
def test_the_admission_policy_lets_the_guard_change_only_the_cause_on_a_vmim(annotations, spec, allowed):
    old, new = vmim_pair(annotations, spec)
    verdict = vap_verdict(old, new, "virtualmachineinstancemigrations")
    assert (verdict == []) is allowed, verdict
