"""The gateway config of every kvpool benchmark, made by the planner from manifests.

Why this module exists: a benchmark that writes its gateway config by hand measures a plan
no user gets, and a planner change (slots, floors, overcommit) never shows in its figures.
Here the config is compiled exactly as ``kvpool compile -f DIR --endpoints POOL=URL`` does
it (:func:`kvpool.adapters.offline_compile.compile_manifests`): the examples' TierPolicy
and TenantBudgets (``examples/tierpolicy.yaml``, ``examples/tenants.yaml``, their Secrets'
keys are the bench clients' keys) and a ModelPool derived from
``examples/modelpool-llama-8b.yaml`` scaled to the bench engine (the tiny model, 2,048 KV
tokens, maxNumSeqs 8, maxModelLen 1024), with the workload figures of one of two mixes:

- ``examples``: the llama-8b example's length mix scaled by maxModelLen (8192 -> 1024):
  prompts mean 112 / p95 375, outputs mean 31 / p95 100;
- ``long-prompt``: a long-prompt batch mix, prompts mean 450 / p95 800, outputs mean 60 /
  p95 120 (one p95 sequence is 45 % of the engine's KV).

Each mix also says what the load generator sends (so the declared figures and the traffic
agree). API for the benchmarks (bench/peers.py, bench/protection*.py, bench/scaleout.py)::

    plan = compile_mix("examples", {"tiny": [url1, url2]}, workdir)
    plan.config          # kvpool.api.admission_config.AdmissionConfig, as compiled
    plan.config_path     # that config as JSON, for `kvpool gateway --config`
    plan.manifests_dir   # the manifests (for `kvpool gateway -f DIR`)
    plan.keys            # tier -> API key of the tenant that the examples classify there
    plan.pool_figures    # the ModelPool's engine/workload/capacity figures planned with
    print(plan.describe())   # the planned slots / tokens per tier, one line each

    .venv/bin/python bench/bench_manifests.py [--mix long-prompt] [--engines 2]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
if str(REPO / "operator") not in sys.path:
    sys.path.insert(0, str(REPO / "operator"))

from kvpool.adapters.offline_compile import compile_manifests  # noqa: E402
from kvpool.api.admission_config import AdmissionConfig, CompiledPool  # noqa: E402

EXAMPLES = REPO / "examples"
POOL = "tiny"  # the ModelPool's name and served model name
NAMESPACE = "llm"  # the examples' namespace
KV_TOKENS = 2048  # the bench engine: 2 MiB of KV cache, 1,024 bytes a token
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 1024
# tier -> the Secret value of the examples' tenant classified into it (examples/tenants.yaml)
KEYS = {
    "interactive": "replace-me-chat-product-key",
    "batch": "replace-me-summarizer-key",
    "eval": "replace-me-eval-internal-key",
}
PRIORITY = {"interactive": 0, "batch": 10, "eval": 20}  # examples/tierpolicy.yaml


@dataclass(frozen=True)
class Mix:
    """A workload: the lengths declared to the planner and what the load generator sends.

    Prompt words are tokens one for one with the tiny model's tokenizer (measured:
    30 -> 31, 300 -> 302 tokens).
    """

    name: str
    prompt_mean: int
    prompt_p95: int
    output_mean: int
    output_p95: int
    batch_prompt_words: tuple[int, int]  # uniform range of a batch prompt
    batch_max_tokens: int
    eval_prompt_words: tuple[int, int]
    eval_max_tokens: int
    chat_first_words: int = 30  # a chat session's first message
    chat_turn_words: int = 12  # each following user message
    chat_max_tokens: int = 16
    peak: Mapping[str, int] = field(
        default_factory=lambda: {"interactive": 4, "batch": 8, "eval": 2}
    )


MIXES: dict[str, Mix] = {
    "examples": Mix(
        "examples",
        prompt_mean=112,
        prompt_p95=375,
        output_mean=31,
        output_p95=100,
        batch_prompt_words=(150, 375),
        batch_max_tokens=100,
        eval_prompt_words=(100, 200),
        eval_max_tokens=64,
    ),
    "long-prompt": Mix(
        "long-prompt",
        prompt_mean=450,
        prompt_p95=800,
        output_mean=60,
        output_p95=120,
        batch_prompt_words=(500, 800),
        batch_max_tokens=120,
        eval_prompt_words=(150, 300),
        eval_max_tokens=64,
    ),
}


@dataclass(frozen=True)
class BenchPlan:
    """One mix compiled for some engines: what a benchmark starts its gateway with."""

    mix: Mix
    config: AdmissionConfig
    config_path: Path
    manifests_dir: Path
    keys: Mapping[str, str]
    pool_figures: Mapping[str, Any]

    @property
    def pool(self) -> CompiledPool:
        return next(p for p in self.config.pools if p.name == POOL)

    def max_queue_wait(self, tier: str) -> float:
        """The seconds a request of ``tier`` may wait for admission (its maxQueueWait)."""
        policy = next(p for p in self.config.tier_policies if p.name == self.pool.tier_policy)
        return next(t.max_queue_wait_seconds for t in policy.tiers if t.name == tier)

    def planned(self) -> dict[str, Any]:
        """The plan's figures (for results files): replicas, slots and tokens per tier."""
        pool = self.pool
        return {
            "mix": self.mix.name,
            "replicas": pool.replicas,
            "tokens_per_replica": pool.tokens_per_replica,
            "slots_per_replica": pool.slots_per_replica,
            "total_tokens": pool.total_tokens,
            "total_slots": pool.total_slots,
            "shared_tokens": pool.shared_tokens,
            "shared_slots": pool.shared_slots,
            "tiers": {
                name: {
                    "floor_slots": t.floor_slots,
                    "floor_tokens": t.floor_tokens,
                    "lendable_slots": t.lendable_slots,
                    "lendable_tokens": t.lendable_tokens,
                }
                for name, t in pool.tiers.items()
            },
        }

    def describe(self) -> str:
        """The planned slots / tokens per tier, so that a planner effect is visible."""
        p = self.planned()
        lines = [
            f"plan ({p['mix']} mix): {p['replicas']} replica(s) x {p['slots_per_replica']} "
            f"slots / {p['tokens_per_replica']} KV tokens; total {p['total_slots']} slots / "
            f"{p['total_tokens']} tokens, shared {p['shared_slots']} / {p['shared_tokens']}"
        ]
        for name, t in p["tiers"].items():
            lines.append(
                f"  {name:12} floor {t['floor_slots']} slots / {t['floor_tokens']} tokens, "
                f"lendable {t['lendable_slots']} / {t['lendable_tokens']}"
            )
        return "\n".join(lines)


def pool_manifest(
    mix: Mix,
    replicas: int,
    tokenizer_path: Path | None,
    *,
    kv_tokens: int = KV_TOKENS,
    max_num_seqs: int = MAX_NUM_SEQS,
    max_model_len: int = MAX_MODEL_LEN,
) -> dict[str, Any]:
    """examples/modelpool-llama-8b.yaml with the bench engine's and the mix's figures."""
    pool = yaml.safe_load((EXAMPLES / "modelpool-llama-8b.yaml").read_text())
    pool["metadata"]["name"] = POOL
    spec = pool["spec"]
    spec["model"]["servedName"] = POOL
    if tokenizer_path is not None:
        spec["model"]["tokenizerPath"] = str(tokenizer_path)
    else:
        spec["model"].pop("tokenizerPath", None)
    spec["engine"]["maxNumSeqs"] = max_num_seqs
    spec["engine"]["maxModelLen"] = max_model_len
    spec["workload"] = {
        "promptTokens": {"mean": mix.prompt_mean, "p95": mix.prompt_p95},
        "outputTokens": {"mean": mix.output_mean, "p95": mix.output_p95},
    }
    capacity = spec["capacity"]
    capacity["minReplicas"] = replicas  # the engines the bench runs, no more, no fewer
    capacity["maxReplicas"] = replicas
    capacity["kvTokensPerReplica"] = kv_tokens
    capacity["peakConcurrency"] = dict(mix.peak)
    return pool


def write_manifests(
    mix: Mix,
    directory: Path,
    replicas: int,
    tokenizer_path: Path | None,
    edit_policy: Callable[[dict[str, Any]], None] | None = None,
    **engine: int,
) -> Path:
    """The examples' TierPolicy and tenants plus the scaled ModelPool, in ``directory``;
    ``edit_policy`` changes the TierPolicy document first (a sweep of one of its fields)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tenants.yaml").write_text((EXAMPLES / "tenants.yaml").read_text())
    policy = yaml.safe_load((EXAMPLES / "tierpolicy.yaml").read_text())
    if edit_policy is not None:
        edit_policy(policy)
    (directory / "tierpolicy.yaml").write_text(yaml.safe_dump(policy, sort_keys=False))
    manifest = pool_manifest(mix, replicas, tokenizer_path, **engine)
    (directory / "modelpool-tiny.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return directory


def compile_mix(
    mix: str | Mix,
    endpoints: Mapping[str, Sequence[str]] | Sequence[str],
    workdir: Path,
    *,
    tokenizer_path: Path | None = None,
    edit_policy: Callable[[dict[str, Any]], None] | None = None,
    name: str | None = None,
    **engine: int,
) -> BenchPlan:
    """Compile ``mix`` for the engines at ``endpoints`` (``{"tiny": [url, ...]}`` or just
    the URLs) as ``kvpool compile`` does; the planner sizes one replica per URL.

    ``engine`` overrides ``kv_tokens``, ``max_num_seqs``, ``max_model_len``;
    ``edit_policy`` edits the examples' TierPolicy document; ``name`` (default: the mix's)
    names the files written under ``workdir``. Raises
    ValueError naming every problem when the manifests do not compile.
    """
    chosen = MIXES[mix] if isinstance(mix, str) else mix
    urls = list(endpoints.get(POOL, ())) if isinstance(endpoints, Mapping) else list(endpoints)
    if not urls:
        raise ValueError(f"compile_mix: no engine URL for pool {POOL!r}; give {{{POOL!r}: [url]}}")
    label = name or chosen.name
    directory = write_manifests(
        chosen, workdir / f"manifests-{label}", len(urls), tokenizer_path, edit_policy, **engine
    )
    result = compile_manifests([str(directory)], {POOL: ",".join(urls)}, {}, namespace=NAMESPACE)
    if result.config is None:
        raise ValueError(
            f"compile_mix({chosen.name!r}): the manifests in {directory} do not compile: "
            + "; ".join(p.format() for p in result.problems)
        )
    if not result.config.pools or not next(
        (p.plan_ok for p in result.config.pools if p.name == POOL), False
    ):
        raise ValueError(
            f"compile_mix({chosen.name!r}): no plan for pool {POOL!r}: "
            + "; ".join(result.warnings)
        )
    config_path = workdir / f"config-{label}.json"
    config_path.write_text(result.config.to_json() + "\n")
    manifest = pool_manifest(chosen, len(urls), tokenizer_path, **engine)
    return BenchPlan(
        mix=chosen,
        config=result.config,
        config_path=config_path,
        manifests_dir=directory,
        keys=dict(KEYS),
        pool_figures={
            "engine": {k: manifest["spec"]["engine"][k] for k in ("maxNumSeqs", "maxModelLen")},
            "workload": manifest["spec"]["workload"],
            "capacity": manifest["spec"]["capacity"],
        },
    )


def main() -> int:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mix", choices=sorted(MIXES), default="examples")
    parser.add_argument("--engines", type=int, default=1, help="replicas (one URL each)")
    args = parser.parse_args()
    urls = [f"http://127.0.0.1:{8000 + i}" for i in range(args.engines)]
    with tempfile.TemporaryDirectory() as tmp:
        plan = compile_mix(args.mix, {POOL: urls}, Path(tmp))
        print(plan.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
