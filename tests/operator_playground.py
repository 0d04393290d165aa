"""Try the operator without a cluster: the API emulator, examples/ applied, the operator running.

    .venv/bin/python -m tests.operator_playground          # until Ctrl-C
    .venv/bin/python -m tests.operator_playground --once   # print `kubectl get kvpool`, exit

It prints the ``kubectl`` command to use against the emulator, e.g.::

    kubectl --kubeconfig /tmp/kvpool-playground-x/kube/kubeconfig \\
            --cache-dir /tmp/kvpool-playground-x/kube/kubectl-cache get kvpool -A

(``kubectl --server http://127.0.0.1:PORT --validate=false --cache-dir DIR get kvpool -A``
works too.) No Prometheus: pools plan with their declared capacity. Everything started is
stopped on exit, Ctrl-C or SIGTERM (which Python would otherwise end without any clean-up,
leaving the operator running).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
from pathlib import Path

import yaml

from tests.operator_process import run_operator
from tests.support.kube import resource_path, start_kube_api
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[1]
PLURALS = {
    "ModelPool": "modelpools",
    "TierPolicy": "tierpolicies",
    "TenantBudget": "tenantbudgets",
    "Secret": "secrets",
}


def _stop_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so every ``with`` block stops what it started."""
    raise KeyboardInterrupt


def main() -> int:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=Path, default=REPO / "examples")
    parser.add_argument("--once", action="store_true", help="print the table and exit")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvpool-playground-"))
    (workdir / "kube").mkdir()
    with start_kube_api(workdir / "kube") as kube:
        docs = [
            d
            for f in sorted(args.examples.glob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text())
            if isinstance(d, dict) and d.get("kind") in PLURALS
        ]
        for doc in docs:
            ns = doc["metadata"].get("namespace", "default")
            kube.client.create(resource_path(doc["apiVersion"], PLURALS[doc["kind"]], ns), doc)
        with run_operator(kube, workdir, interval="5s") as op:
            pools = [
                resource_path(
                    d["apiVersion"],
                    "modelpools",
                    d["metadata"].get("namespace", "default"),
                    d["metadata"]["name"],
                )
                for d in docs
                if d["kind"] == "ModelPool"
            ]
            wait_until(lambda: all(kube.client.get(p).get("status", {}).get("plan") for p in pools))
            print(
                f"API emulator: {kube.url}  (operator pid {op.process.pid}, "
                f"log: {op.process.log_path})"
            )
            print(
                f"kubectl --kubeconfig {kube.kubeconfig} --cache-dir {kube.kubectl_cache} "
                "get kvpool -A"
            )
            print(kube.kubectl("get", "kvpool", "-A").stdout)
            if args.once:
                return 0
            with contextlib.suppress(KeyboardInterrupt):
                print("Ctrl-C to stop", flush=True)
                assert op.process.proc is not None
                op.process.proc.wait()  # idle until the user stops it (or the operator exits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
