"""Sizes the simulator accepts in one run, so that absurd input is refused before any work.

A limit bounds what a plan or a packet list may hold (not a hardware fact): each is named in
the error it raises, with the environment variable that raises it.
"""
from __future__ import annotations

import os

#: name -> (environment variable, default)
LIMITS = {
    "tiles": ("KBTORCH_MAX_TILES", 1_000_000),          # GEMM macro-tiles (K steps included)
    "messages": ("KBTORCH_MAX_MESSAGES", 1_000_000),    # messages of one traffic run
    "flits": ("KBTORCH_MAX_FLITS", 1 << 32),            # flits of one traffic run
    "points": ("KBTORCH_MAX_POINTS", 10_000),           # points of one sweep, counted before expansion
    "depth": ("KBTORCH_MAX_DEPTH", 16),                 # nesting of tables and lists in a sweep spec
}


def limit(name: str) -> int:
    env, default = LIMITS[name]
    text = os.environ.get(env)
    if text is None:
        return default
    # NOTE: ASCII digits only (int() also takes '١٢', '1_000' and spaces); a limit is positive.
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or int(digits) < 1:
        raise ValueError(f"${env}={text!r} is not a positive integer (unset it for the default {default})")
    return int(digits)


def check(name: str, value: int, what: str) -> None:
    """ValueError naming ``what`` if ``value`` exceeds the limit ``name``."""
    most = limit(name)
    if value > most:
        raise ValueError(f"{what}: {value} {name} exceed the limit of {most} per run "
                         f"(set {LIMITS[name][0]} to raise it)")


def check_hbm(machine, pes, need_per_pe: int, what: str) -> None:
    """ValueError naming ``what`` if the HBM of ``pes`` cannot hold ``need_per_pe`` bytes for
    each of them (PEs that share a memory node share its capacity)."""
    demand: dict = {}
    for pe in pes:
        node = machine.memory(pe, "hbm")
        demand[node] = demand.get(node, 0) + need_per_pe
    for node, need in demand.items():
        cap = machine.node_capacity(node)
        if need > cap:
            raise ValueError(f"{what}: needs {need} bytes of HBM in '{node}', which holds {cap} "
                             f"(topology '{machine.name}')")
