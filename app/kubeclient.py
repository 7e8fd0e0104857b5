"""An ``ApiClient`` for the cluster: from ``--kubeconfig`` or, inside a pod, in-cluster.

Thin on purpose: the ``kubernetes`` package does the parsing, auth plugins and
TLS. What this adds is an error that names the file or says what is missing,
instead of a traceback.
"""

from __future__ import annotations

import os

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException


class KubeConfigError(ValueError):
    """No usable cluster configuration; the text says which and why."""


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def api_client(kubeconfig: str | None = None, context: str | None = None) -> k8s.ApiClient:
    """A client from ``kubeconfig`` (a path), or in-cluster config when it is None."""
    configuration = k8s.Configuration()
    try:
        if kubeconfig:
            if not os.path.isfile(kubeconfig):
                raise KubeConfigError(f"--kubeconfig {kubeconfig}: no such file")
            k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration,
                                        persist_config=False)
        elif in_cluster():
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            raise KubeConfigError("no cluster configured: pass --kubeconfig FILE (or --snapshot FILE), "
                                  "or run inside a pod")
    except ConfigException as e:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config"
        raise KubeConfigError(f"{where}: {e}") from None
    except (OSError, ValueError, TypeError, KeyError) as e:
        if isinstance(e, KubeConfigError):
            raise
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "in-cluster config"
        raise KubeConfigError(f"{where}: cannot load: {e}") from None
    return k8s.ApiClient(configuration=configuration)
