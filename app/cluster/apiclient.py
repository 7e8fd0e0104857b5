"""A Kubernetes ApiClient: ``--kubeconfig`` when given, else the pod's service account."""

from __future__ import annotations

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException


class ClusterConfigError(ValueError):
    """No usable cluster credentials; the text names where the guard looked."""


def api_client(kubeconfig: str | None = None) -> client.ApiClient:
    try:
        if kubeconfig:
            return config.new_client_from_config(config_file=kubeconfig)
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    except (ConfigException, OSError) as e:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig else "in-cluster service account (no --kubeconfig given)"
        raise ClusterConfigError(f"{where}: {e}") from None
