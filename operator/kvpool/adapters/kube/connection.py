"""Where and how to reach the API server: a kubeconfig, or the pod's service account.

Why it exists: the operator, ``kubectl kvpool`` and the tests reach the API the way
kubectl does (an explicit kubeconfig, ``$KUBECONFIG``, ``~/.kube/config``, else
in-cluster); the official client only parses the config, the calls are our own client's
(:mod:`.client`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

SA_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


@dataclass(frozen=True)
class KubeConnection:
    """Where and how to reach the API server."""

    server: str  # e.g. https://10.96.0.1:443 or http://127.0.0.1:PORT
    token: str | None = None  # bearer token (kubeconfig)
    token_file: Path | None = None  # re-read per request (in-cluster tokens rotate)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True


def load_connection(kubeconfig: str | None = None, context: str | None = None) -> KubeConnection:
    """Connection settings from a kubeconfig (explicit, ``$KUBECONFIG``, ~/.kube/config),
    else from the in-cluster service account."""
    from kubernetes import client, config  # the official client only parses the config

    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    default = Path.home() / ".kube" / "config"
    if path or default.exists():
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path or str(default), context=context, client_configuration=cfg
        )
        token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
        if token and token.lower().startswith("bearer "):
            token = token[7:]
        return KubeConnection(
            server=cfg.host.rstrip("/"),
            token=token,
            ca_file=cfg.ssl_ca_cert,
            cert_file=cfg.cert_file,
            key_file=cfg.key_file,
            verify=bool(cfg.verify_ssl),
        )
    config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    return KubeConnection(server=cfg.host.rstrip("/"), token_file=SA_TOKEN, ca_file=cfg.ssl_ca_cert)
