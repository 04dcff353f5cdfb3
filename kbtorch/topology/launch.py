"""Kernel launch, from the optional ``[launch]`` section of a topology file.

A kernel-launch command is a routed request like any other: the launching control processor
(``node``, found in the innermost block around the PE that has a node of that name) spends
``fixed_ns`` per kernel, then sends a ``message_bytes`` launch message over the graph to the
PE's control processor (``cp`` role); the PE's program starts when it arrives. Without the
section every program starts at t = 0 (the launch is not modeled).

NOTE: the message is a multicast (one copy per link, as on a NoC with multicast): launches
to different PEs do not queue behind each other, so a PE's start is the uncontended
latency of one message: the fixed cost, the head latency of the route (propagation, one
flit and the switching cost of each node entered) and the rest of the message's flits on
the route's slowest link.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import TopologyError

#: The cause of a launch segment in a latency chain (see ``sim.blame``).
CAUSE = "launch"


@dataclass(frozen=True)
class Launch:
    """The ``[launch]`` section: launching node (a local name), message size, fixed cost."""

    node: str
    message_bytes: int
    fixed_ns: float


def source(machine, pe: int) -> str:
    """The launching node of PE ``pe``: ``node`` in the innermost enclosing block that has it."""
    parts = machine.pes[pe].prefix.rstrip(".").split(".")
    for i in range(len(parts) - 1, -1, -1):
        name = ".".join(parts[:i] + [machine.launch.node])
        if name in machine.graph:
            return name
    raise TopologyError(machine.path, "launch.node", f"no node '{machine.launch.node}' in any block around PE {pe} "
                        f"('{machine.pes[pe].prefix}')")


def segments(machine, pe: int) -> tuple:
    """``((element, ps), ...)`` of PE ``pe``'s launch, in time order: the source's fixed
    cost, then each hop's link (propagation and one flit) and node (switching cost; the CP's
    own is charged when it starts the program), then
    the remaining flits on the slowest link. Empty without a ``[launch]`` section."""
    spec = machine.launch
    if spec is None:
        return ()
    g, src = machine.graph, source(machine, pe)
    path = machine.route(src, machine.pes[pe].node("cp"))
    out = [(src, round(spec.fixed_ns * 1000))]
    for u, v in zip(path, path[1:]):
        e = g.edges[u, v]
        # NOTE: the CP's own switching cost is charged when it starts the program (PEModel.launch).
        out += [((u, v), e["prop_ps"] + e["flit_ps"]), (v, g.nodes[v]["overhead_ps"] if v != path[-1] else 0)]
    hops = list(zip(path, path[1:]))
    slow = max(hops, key=lambda h: g.edges[h]["flit_ps"])
    flits = -(-spec.message_bytes // machine.flit_bytes)
    out.append((slow, (flits - 1) * g.edges[slow]["flit_ps"]))
    return tuple((el, ps) for el, ps in out if ps > 0)
