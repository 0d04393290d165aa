"""examples/compose/compose.yaml holds together without Docker: the gateway's command is
one ``kvpool gateway`` accepts, it compiles the manifests it mounts, its endpoint is the
engine service at the engine's port, the engine serves the pool's model name with
priority scheduling, and the image is the package's version."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

import kvpool
from kvpool.adapters.offline_compile import compile_manifests, parse_endpoint_flags
from kvpool.gateway.flags import add_arguments

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "examples" / "compose" / "compose.yaml"


def services() -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return found


def gateway_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvpool gateway")
    add_arguments(parser)
    command = services()["gateway"]["command"]
    assert command[0] == "gateway"
    return parser.parse_args(command[1:])


def engine_flags() -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in services()["engine"]["command"])


def test_the_gateway_compiles_the_manifests_it_mounts() -> None:
    args = gateway_args()
    mounts = {target: source for source, target, *_ in
              (v.split(":") for v in services()["gateway"]["volumes"])}  # fmt: skip
    (path,) = args.manifests
    host_dir = (COMPOSE.parent / mounts[path]).resolve()

    result = compile_manifests([str(host_dir)], parse_endpoint_flags(args.endpoints), {})

    assert host_dir == REPO / "examples"
    assert result.config is not None, [p.format() for p in result.problems]
    served = {p.served_name: p for p in result.config.pools}
    assert served["llama-8b"].tracks[0].endpoints[0].url == "http://engine:8000"


def test_the_engine_serves_the_pool_the_gateway_routes_to() -> None:
    flags, args = engine_flags(), gateway_args()
    (endpoints,) = args.endpoints
    pool, _, urls = endpoints.partition("=")

    pool_doc = yaml.safe_load((REPO / "examples" / "modelpool-llama-8b.yaml").read_text())
    assert flags["served-model-name"] == pool_doc["spec"]["model"]["servedName"] == pool
    assert flags["model"] == pool_doc["spec"]["model"]["name"]
    assert flags["scheduling-policy"] == "priority"
    assert int(flags["max-model-len"]) == pool_doc["spec"]["engine"]["maxModelLen"]
    assert urls.endswith(f"http://engine:{flags['port']}")


def test_redis_and_the_image_are_the_ones_the_file_defines() -> None:
    args = gateway_args()

    assert args.redis == "redis://redis:6379/0" and "redis" in services()
    image = services()["gateway"]["image"]
    assert image == f"ghcr.io/kvpool/kvpool:{kvpool.__version__}"
    assert args.listen == ("0.0.0.0", 8080)
