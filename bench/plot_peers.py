"""Draw the peers run: the CDF of chat TTFT per config, and each config's output share by
tier over the seconds of a round, from a peers results file.

Why this script exists: a percentile table hides the shape of a tail, and a share over a
whole run hides a tier starved for a while and served later; the CDF shows where each
config's slow chats start, the share over time whether a tier ever goes without. It reads
what bench/peers.py wrote (every chat TTFT sample, output tokens by tier in 5 s buckets)
and measures nothing itself.

    .venv/bin/python bench/plot_peers.py [bench/results/peers-examples.json]

Writes the PNGs next to the results file (``peers-examples-ttft-cdf.png``,
``peers-examples-share-over-time.png``); needs matplotlib (in the dev venv).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "peers-examples.json"


def cdf(samples: list[float]) -> tuple[list[float], list[float]]:
    """Sorted samples and the share of samples at or below each."""
    ordered = sorted(samples)
    count = len(ordered)
    return ordered, [(i + 1) / count for i in range(count)]


TIERS = ("interactive", "batch", "eval")


def shares_over_time(series: dict[str, Any]) -> tuple[list[float], dict[str, list[float]]]:
    """Bucket start times (s) and each tier's share of the output in that bucket, summed
    over the rounds (buckets a round did not reach are left out of that round)."""
    rounds = series.get("rounds") or []
    width = float(series.get("bucket_seconds") or 5.0)
    count = max((len(r) for r in rounds), default=0)
    times, shares = [], {t: [] for t in TIERS}
    for i in range(count):
        sums = {t: sum(r[i].get(t, 0) for r in rounds if i < len(r)) for t in TIERS}
        total = sum(sums.values())
        if not total:
            continue
        times.append(i * width)
        for tier in TIERS:
            shares[tier].append(sums[tier] / total)
    return times, shares


def draw_shares(plt: Any, document: dict[str, Any], out: Path) -> bool:
    drawn = {
        name: shares_over_time(config["output_by_tier_over_time"])
        for name, config in document["configs"].items()
        if config.get("output_by_tier_over_time") and name != "chat-alone"
    }
    drawn = {name: series for name, series in drawn.items() if series[0]}
    if not drawn:
        return False
    figure, axes = plt.subplots(len(drawn), 1, figsize=(8, 1.7 * len(drawn)), sharex=True)
    for ax, (name, (times, shares)) in zip(
        [axes] if len(drawn) == 1 else axes, drawn.items(), strict=True
    ):
        ax.stackplot(times, *(shares[t] for t in TIERS), labels=TIERS, step="post")
        ax.set_ylim(0, 1)
        ax.set_ylabel(name, fontsize=8)
        ax.grid(True, alpha=0.3)
    (axes if len(drawn) == 1 else axes[0]).legend(loc="upper right", fontsize=7, ncol=3)
    (axes if len(drawn) == 1 else axes[-1]).set_xlabel("seconds into a round")
    figure.suptitle("output share by tier over a round (all rounds summed)", fontsize=10)
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, nargs="?", default=RESULTS)
    args = parser.parse_args()
    try:
        document = json.loads(args.results.read_text())
    except (OSError, ValueError) as exc:
        print(f"cannot read {args.results}: {exc} (run bench/peers.py first)")
        return 2
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install matplotlib)")
        return 2
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for name, config in document["configs"].items():
        samples = config.get("chat_ttft_samples_ms") or []
        if samples:
            xs, ys = cdf(samples)
            axes.plot(xs, ys, label=f"{name} ({config['engines']} engine(s))")
    params = document["params"]
    axes.set_xscale("log")
    axes.set_xlabel("chat time to first token (ms, log scale)")
    axes.set_ylabel("share of chats")
    axes.set_title(
        f"chat TTFT, {params['rounds']} rounds x {params['seconds']:g} s a config,"
        f" mix {params['mix']} ({document['when']})"
    )
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="lower right", fontsize=8)
    out = args.results.with_name(args.results.stem + "-ttft-cdf.png")
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    print(f"wrote {out}")
    shares = args.results.with_name(args.results.stem + "-share-over-time.png")
    if draw_shares(plt, document, shares):
        print(f"wrote {shares}")
    else:
        print("no output-by-tier series in the results (an older peers run): no share plot")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
