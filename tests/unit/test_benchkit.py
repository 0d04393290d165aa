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
