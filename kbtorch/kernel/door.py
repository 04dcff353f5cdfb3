"""The door to the simulator: everything the layers above ``kernel`` take from ``sim/``
(command types, modes, paths, the resource model, the symmetry reduction, results), and the
one place where a Simulator is made and released (``simulator``).

NOTE: above this layer nothing imports ``kbtorch.sim`` (``tests/test_imports.py``): a change
of the engine's modules is a change of this file's imports only.
"""
from __future__ import annotations

from contextlib import contextmanager

from ..sim import symmetry
from ..sim.commands import Command, Composite, Compute, Dma, Fetch, Loc, Move, Multicast, Send, Share, Signal, Store, Wait
from ..sim.components.dma import data_path, data_paths
from ..sim.engine import paused_gc
from ..sim.multicast import MulticastError, can_multicast, tree
from ..sim.network import MODES
from ..sim.resources import resource_ps, spread
from ..sim.simulator import RunResult, Simulator
from ..sim.symmetry import hardware
from ..sim.traffic import PATTERNS, pattern_messages, pattern_pairs

__all__ = ["MODES", "PATTERNS", "Command", "Composite", "Compute", "Dma", "Fetch", "Loc", "Move", "Multicast",
           "MulticastError", "RunResult", "Send", "Share", "Signal", "Store", "Wait", "can_multicast", "data_path",
           "data_paths", "hardware", "paused_gc", "pattern_messages", "pattern_pairs", "resource_ps", "simulator",
           "spread", "symmetry", "tree"]


@contextmanager
def simulator(machine, *, mode: str = "fast", trace: bool = False, weight=None):
    """A fresh Simulator of ``machine`` for one run, released on leaving the block (its
    engine, network and components freed): ``with simulator(m) as sim: result = sim.run(p)``."""
    sim = Simulator(machine, mode=mode, trace=trace, weight=weight)
    try:
        yield sim
    finally:
        sim.release()
