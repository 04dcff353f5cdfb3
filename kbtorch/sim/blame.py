"""Latency attribution: every timestamp carries the chain of costs that produced it.

A chain is ``None`` (time zero) or a tuple ``(element, cause, ps, parent)``: an element is a
node name or an edge ``(u, v)``; the ``ps`` of a chain add up exactly to its timestamp, so
every picosecond of a reported latency belongs to one node or edge. Causes: ``issue`` (command
issue cost), ``fixed`` (switching overhead), ``link`` (serialisation and propagation),
``queue`` (waiting behind other traffic at that element), ``service`` (a memory channel or
engine holding the request), ``launch`` (the kernel launch reaching a PE: ``topology.launch``).
"""
from __future__ import annotations


def extend(chain, element, cause: str, ps: int):
    """The chain advanced by ``ps`` spent at ``element``; unchanged if ``ps`` is 0."""
    if ps <= 0:
        if ps < 0:
            raise ValueError(f"negative attribution {ps} ps at {element}")
        return chain
    return (element, cause, ps, chain)


def total(chain) -> int:
    t = 0
    while chain is not None:
        t += chain[2]
        chain = chain[3]
    return t


def segments(chain) -> list[tuple]:
    """``(element, cause, ps)`` from the start of time to the chain's end.

    A record whose cause is ``hop`` holds a static hop (``network.Hop``) and stands for
    its segments: the link's serialisation and propagation, then the node's overhead.
    """
    out = []
    while chain is not None:
        if chain[1] == "hop":
            out.extend(reversed(chain[0].segs))
        else:
            out.append(chain[:3])
        chain = chain[3]
    out.reverse()
    return out
