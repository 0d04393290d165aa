"""Draw the peers run: the CDF of chat TTFT per config, from a peers results file.

Why this script exists: a percentile table hides the shape of a tail; the CDF shows where
each config's slow chats start. It reads what bench/peers.py wrote (every chat TTFT
sample) and measures nothing itself.

    .venv/bin/python bench/plot_peers.py [bench/results/peers-examples.json]

Writes the PNG next to the results file (``peers-examples-ttft-cdf.png``); needs
matplotlib (in the dev venv).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "peers-examples.json"


def cdf(samples: list[float]) -> tuple[list[float], list[float]]:
    """Sorted samples and the share of samples at or below each."""
    ordered = sorted(samples)
    count = len(ordered)
    return ordered, [(i + 1) / count for i in range(count)]


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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
