"""Coarse mode against fast mode across chips (issue 45 item 5): every collective, every
algorithm that applies, at 64 KiB, 1 MiB and 4 MiB per member, across the 4 chips of
``tests/data/tiny_system.toml`` (or ``--topology``; ``--group``: ``across:chip`` by
default). Prints each error of coarse against fast and the range per collective.

    python benchmarks/bench_coarse_chips.py [--topology T] [--group G] [--json]

Nothing is asserted here; ``tests/test_coarse_chips.py`` holds the documented bound
(docs/model.md, "Coarse mode"), which this table is the measurement of.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tabulate import tabulate

from kbtorch.ops.collective import CollectiveError, collective
from kbtorch.ops.collective.algorithms import ALGOS
from kbtorch.topology import load_machine

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
SIZES = (64 << 10, 1 << 20, 4 << 20)
SYSTEM = Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny_system.toml"


def measure(machine, group: str, kinds=KINDS, sizes=SIZES, algos=ALGOS) -> list:
    """[(kind, bytes, algorithm, fast ns, coarse ns, error %)] for every algorithm that applies."""
    rows = []
    for kind in kinds:
        for nbytes in sizes:
            for algo in algos:
                try:
                    fast, coarse = (collective(kind, group=group, algo=algo, nbytes=nbytes, machine=machine,
                                               mode=mode).latency_ns for mode in ("fast", "coarse"))
                except CollectiveError:
                    continue
                rows.append((kind, nbytes, algo, fast, coarse, 100 * (coarse - fast) / fast))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--topology", default=str(SYSTEM))
    ap.add_argument("--group", default="across:chip")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = measure(load_machine(args.topology), args.group)
    if args.json:
        print(json.dumps([dict(zip(("kind", "bytes", "algo", "fast_ns", "coarse_ns", "error_pct"), r)) for r in rows]))
        return
    print(tabulate(rows, headers=("collective", "bytes", "algo", "fast ns", "coarse ns", "error %"),
                   floatfmt=("", "", "", ".1f", ".1f", "+.1f")))
    print()
    for kind in KINDS:
        errs = [r[5] for r in rows if r[0] == kind]
        if errs:
            print(f"{kind:15} coarse - fast: {min(errs):+.1f}% .. {max(errs):+.1f}% over {len(errs)} runs")


if __name__ == "__main__":
    main()
