"""The one simulation policy: the mode that ``mode="auto"`` runs a kernel in, for a kernel of
an op family (``sim_mode``), a collective (``collective_mode``) and graph mode's joined
programs (``graph_mode``), with the thresholds behind each. (How much is simulated, the
fidelity, is ``steady``'s.)
"""
from __future__ import annotations

from ..sim.resources import resource_ps

#: Above this many flit crossings of links by a kernel's own traffic (its busy time per link
#: over that link's flit time, ``sim.resources.resource_ps``), ``mode="auto"`` runs coarse.
# NOTE: fast mode's events follow the flits it moves hop by hop (about one event per 4 to 5
# crossings): the grid-order 2d reduce-scatter of 896 KiB over 256 PEs crosses 11.8 M
# (2.5 M events, 13-17 s fast; coarse 3.4 s, -1.9%), its all-gather 4.0 M (1.1 M events,
# 7-8 s), a 7 KiB all-reduce 0.19 M (2 s). 8 M is where a fast run passes about 10 s. A
# GEMM's trains stream whole tiles, so coarse is closer still: maia200 2048 x 3584 x 8192
# over 36 tiles (25.4 M crossings) 1.55 M events and 14 s fast, 21 k and 0.7 s coarse,
# +0.05%; AHBM 2048 x 18944 x 3584 (41 M) -0.11%; below the limit, maia200 16 x 3584 x
# 8192 +0.31%, AHBM 128 x 18944 x 3584 -0.04% (both stay fast).
COARSE_FLIT_HOPS = 8_000_000
#: Above this many bytes moved in all (nbytes x members x 3), a collective runs coarse.
COARSE_BYTES = 4 * 2**30
#: Above this many commands in a collective's built kernel (all members' programs), it runs
#: coarse.
# NOTE: the fast mode's wall time grows with the kernel's commands as well as its bytes:
# in torch's rank order (``order="rank"``, one packet per strided block) a 2d all-gather
# of 65 280 commands over 256 PEs takes 13 to 32 s, a 2d reduce-scatter of 185 344
# commands 56 to 82 s (coarse: within 3% of their latencies, 1.5x to 3x faster; the same
# reduce-scatter in grid order has 10 312 commands and takes 14 s fast),
# a hierarchical all-reduce of 7 KiB (3 072 commands) 2 s. 50 000 commands is where a
# fast run reaches tens of seconds; small all-reduces stay well below it (and fast: coarse
# is up to 7% off on them), as does a 1 KiB ring over one SIP (47 616).
COARSE_COMMANDS = 50_000
#: Above this many joined commands, graph mode simulates coarse (trains of up to 4096
#: flits): a Qwen2.5-7B decode layer (22 k commands) runs 3.6x faster, 1% off fast.
GRAPH_COARSE_COMMANDS = 5000


def sim_mode(mode: str, machine, programs: dict, busy: dict | None = None, big: bool = False) -> str:
    """The simulation mode of a kernel's built ``programs`` under ``mode="auto"``: coarse when
    ``big`` (a family's own reason) or its traffic crosses links more than
    ``COARSE_FLIT_HOPS`` times (``busy``: its resource load, computed when not given), else
    fast; an explicit mode as given."""
    if mode != "auto":
        return mode
    busy = resource_ps(machine, programs) if busy is None else busy
    edges = machine.graph.edges
    hops = sum(ps // edges[r]["flit_ps"] for r, ps in busy.items() if isinstance(r, tuple))
    return "coarse" if big or hops > COARSE_FLIT_HOPS else "fast"


def collective_mode(mode: str, machine, moved: int, programs: dict, busy: dict) -> str:
    """A collective's mode under ``mode="auto"``: coarse when it moves more than
    ``COARSE_BYTES`` in all (``moved``: nbytes x members, times 3), its kernel has more than
    ``COARSE_COMMANDS`` commands or its traffic crosses links more than ``COARSE_FLIT_HOPS``
    times (``busy``: its resource load, ``sim_mode``), else fast; an explicit mode as given."""
    big = 3 * moved > COARSE_BYTES or sum(len(c) for c in programs.values()) > COARSE_COMMANDS
    return sim_mode(mode, machine, programs, busy, big)


def graph_mode(mode: str, commands: int) -> str:
    """Graph mode's joined run under ``mode="auto"``: coarse above ``GRAPH_COARSE_COMMANDS``
    commands, else fast; an explicit mode as given."""
    if mode != "auto":
        return mode
    return "coarse" if commands > GRAPH_COARSE_COMMANDS else "fast"
