"""Build a ``kubernetes`` ApiClient: in-cluster when running in a pod, else from a kubeconfig file.

Shared by ``serve`` (watches) and anything else that talks to the API server
(side effects, ``explain``/``report`` against a live cluster).
"""

from __future__ import annotations

import os

from kubernetes import client, config

IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"


class KubeConfigError(Exception):
    """No usable way to reach the API server; the text says which file or setting."""


def in_cluster() -> bool:
    return bool(os.environ.get(IN_CLUSTER_ENV))


def kube_configuration(kubeconfig: str | None = None, context: str | None = None) -> client.Configuration:
    """``--kubeconfig FILE`` if given; else the pod's service account; else ``$KUBECONFIG``.

    Never falls back to ``~/.kube/config`` silently: a webhook that quietly
    talks to whatever cluster the operator's laptop points at is a foot-gun.
    """
    cfg = client.Configuration()
    if kubeconfig:
        _load_file(kubeconfig, context, cfg)
    elif in_cluster():
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException as e:
            raise KubeConfigError(f"in-cluster config: {e}") from None
    elif os.environ.get("KUBECONFIG"):
        _load_file(os.environ["KUBECONFIG"].split(os.pathsep)[0], context, cfg)
    else:
        raise KubeConfigError(
            "no cluster to talk to: pass --kubeconfig FILE (or set KUBECONFIG), run in a pod, or use --snapshot FILE"
        )
    return cfg


def api_client(
    kubeconfig: str | None = None,
    context: str | None = None,
    *,
    retries: bool | int | None = False,
    pool_size: int = 8,
) -> client.ApiClient:
    """An ApiClient; ``retries=False`` (the default) leaves retrying to the caller.

    The watch loops do their own backoff with jitter; letting urllib3 also
    retry (immediately, three times, and sleeping on ``Retry-After`` inside a
    call) would hide failures from the loop and stall it unpredictably.
    """
    cfg = kube_configuration(kubeconfig, context)
    cfg.retries = retries
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)


def _load_file(path: str, context: str | None, cfg: client.Configuration) -> None:
    if not os.path.isfile(path):
        raise KubeConfigError(f"--kubeconfig {path}: no such file")
    try:
        config.load_kube_config(config_file=path, context=context, client_configuration=cfg,
                                persist_config=False)
    except (config.ConfigException, OSError, ValueError, TypeError, KeyError) as e:
        raise KubeConfigError(f"--kubeconfig {path}: {e}") from None
    except Exception as e:  # yaml errors and friends: name the file, never a traceback
        raise KubeConfigError(f"--kubeconfig {path}: not a usable kubeconfig: {type(e).__name__}: {e}") from None
