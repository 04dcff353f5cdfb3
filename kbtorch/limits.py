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
    # NOTE: 4 Mi flits (1 GiB at 256 B flits) take ~2.7 GB and ~9 min in flit-exact mode.
    "flits": ("KBTORCH_MAX_FLITS", 1 << 22),            # flits of one traffic run, or of any flit-exact run
    "points": ("KBTORCH_MAX_POINTS", 10_000),           # points of one sweep, counted before expansion
    "depth": ("KBTORCH_MAX_DEPTH", 16),                 # nesting of tables and lists in a sweep spec
    # NOTE: not KBTORCH_MAX_ELEMENTS, which bounds a topology's nodes + links (topology/load/validate.py).
    "elements": ("KBTORCH_MAX_TENSOR_ELEMENTS", 1 << 28),  # elements of one host tensor an input asks for
    "point_s": ("KBTORCH_MAX_POINT_S", 3600),           # wall seconds of one sweep point
    "point_bytes": ("KBTORCH_MAX_POINT_BYTES", 8 << 30),  # address space one sweep point may add
}
#: Limits that decide a run's result (a sweep point's key holds their values); the per-point
#: wall time and memory only decide whether it finishes (``--retry-failed`` runs it again).
RESULT_LIMITS = ("tiles", "messages", "flits", "elements")


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


def check_environment() -> None:
    """ValueError naming the first ``KBTORCH_MAX_*`` variable that is not a positive integer
    (a command or script checks them all before any work)."""
    for name in LIMITS:
        limit(name)


def in_force() -> dict:
    """``{environment variable: value}`` of the limits that decide a run's result."""
    return {LIMITS[name][0]: limit(name) for name in RESULT_LIMITS}


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
