"""The statistics the benchmarks report (bench/benchkit.py): percentiles and the bootstrap
interval every p95 ratio of bench/protection.py carries."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType

BENCHKIT = Path(__file__).resolve().parents[2] / "bench" / "benchkit.py"


def load_benchkit() -> ModuleType:
    spec = importlib.util.spec_from_file_location("benchkit", BENCHKIT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("benchkit", module)
    spec.loader.exec_module(module)
    return module


benchkit = load_benchkit()


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (benchkit.percentile(values, 50), benchkit.percentile(values, 95)) == (50.0, 95.0)
    assert benchkit.percentile([], 95) is None


def test_the_interval_of_a_ratio_holds_the_true_ratio() -> None:
    rng = random.Random(3)
    base = [rng.lognormvariate(2.4, 0.3) for _ in range(120)]
    doubled = [2 * rng.lognormvariate(2.4, 0.3) for _ in range(120)]
    low, high = benchkit.bootstrap_ratio_interval(doubled, base)
    assert low < 2.0 < high
    same_low, same_high = benchkit.bootstrap_ratio_interval(base, base)
    assert same_low <= 1.0 <= same_high


def test_no_samples_no_interval() -> None:
    assert benchkit.bootstrap_ratio_interval([], [1.0, 2.0]) is None


def test_bootstrap_percentile_interval_brackets_the_percentile() -> None:
    rng = random.Random(3)
    values = [rng.expovariate(1 / 50) for _ in range(300)]
    p95 = benchkit.percentile(values, 95)
    low, high = benchkit.bootstrap_percentile_interval(values, 95)
    assert low <= p95 <= high
    assert benchkit.bootstrap_percentile_interval([], 95) is None
    assert benchkit.bootstrap_percentile_interval([7.0] * 20, 99) == (7.0, 7.0)


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHKIT.with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_bench_configs_come_from_the_planner(tmp_path: Path) -> None:
    """bench/bench_manifests.py compiles the examples' manifests scaled to the bench
    engine: one replica per URL, the engine's running batch as slots, the examples'
    floors, the clients' keys matching the examples' Secrets."""
    bench_manifests = _load("bench_manifests")
    cases = [  # (mix, engines, slots a replica, interactive floor slots, batch floor tokens)
        ("examples", 1, 8, 4, 475),
        ("examples", 2, 8, 8, 1105),
        ("long-prompt", 1, 8, 4, 920),
    ]
    for mix, engines, slots, interactive_slots, batch_tokens in cases:
        urls = [f"http://127.0.0.1:{9000 + i}" for i in range(engines)]
        plan = bench_manifests.compile_mix(mix, {"tiny": urls}, tmp_path / f"{mix}{engines}")
        figures = plan.planned()
        assert (figures["replicas"], figures["slots_per_replica"]) == (engines, slots), mix
        assert figures["tiers"]["interactive"]["floor_slots"] == interactive_slots, mix
        assert figures["tiers"]["batch"]["floor_tokens"] == batch_tokens, mix
        assert [e.url for t in plan.pool.tracks for e in t.endpoints] == urls
        assert set(plan.keys) == {"interactive", "batch", "eval"}
        assert plan.config_path.read_text().startswith("{")
