"""Transfer study: DMA bandwidth vs payload for near and far PE pairs, mesh vs torus.

For each topology and PE pair, the source PE's DMA read engine moves a payload from its HBM
slice to the destination PE's HBM slice; the table shows latency, achieved GB/s and the
component kind that dominates the latency. Run: ``python examples/transfer_sweep.py``.
"""
from __future__ import annotations

import sys

from tabulate import tabulate

from kbtorch.cli import ArgumentParser, run_script
from kbtorch.sim.commands import Dma, Loc
from kbtorch.sim.simulator import Simulator
from kbtorch.topology import load_machine

PAIRS = {"same CUBE": (0, 7), "next CUBE": (0, 8), "across SIP": (0, 128), "far corner": (0, 255),
         "CUBE x=0 -> x=3": (0, 24)}
SIZES = (256, 4 << 10, 64 << 10, 1 << 20, 16 << 20)


def transfer(machine, src: int, dst: int, nbytes: int):
    """Latency (ns), GB/s and dominant component kind of one HBM -> HBM DMA."""
    cmd = Dma(Loc(machine.pes[src].hbm), Loc(machine.pes[dst].hbm), nbytes, engine="dma_rd")
    result = Simulator(machine).run({src: [cmd]})
    breakdown = result.breakdown()
    top = max(breakdown, key=breakdown.get)
    return result.latency_ns, nbytes / result.latency_ns, top


def main(argv=None) -> None:
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topologies", default="ahbm,ahbm_torus", help="comma-separated topology names")
    args = parser.parse_args(argv)
    rows = []
    for name in args.topologies.split(","):
        machine = load_machine(name)
        for label, (src, dst) in PAIRS.items():
            for nbytes in SIZES:
                ns, gbps, top = transfer(machine, src, dst, nbytes)
                rows.append((name, label, f"{src}->{dst}", nbytes, f"{ns:.1f}", f"{gbps:.1f}", top))
    print(tabulate(rows, headers=("topology", "pair", "PEs", "bytes", "latency ns", "GB/s", "dominant")))


if __name__ == "__main__":
    sys.exit(run_script(main))
