"""The steps of a collective schedule and the building blocks its algorithms share.

``Xfer`` (one transfer of blocks from member to member), ``Schedule`` (steps of transfers)
and the phases several algorithms are made of: ring reduce-scatter and all-gather, broadcast
chains, recursive doubling, phases run side by side (``merge``) and block renaming
(``relabel``). The algorithms themselves are in ``algorithms/``, one module each."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Xfer:
    """``src`` sends its value of ``blocks`` (sorted block ids) to ``dst``."""

    src: int
    dst: int
    blocks: tuple
    reduce: bool


@dataclass(frozen=True)
class Schedule:
    """A collective as steps of transfers over ``n`` members and ``blocks`` blocks.

    ``holds[i]``: the blocks member ``i`` has a value of before step 0; ``keeps[i]``: the
    blocks of its output (in output order)."""

    kind: str
    algo: str
    n: int
    blocks: int
    steps: tuple
    holds: tuple
    keeps: tuple

    @property
    def transfers(self) -> int:
        return sum(len(s) for s in self.steps)


def ring_rs(order: list, blocks_of, forward: bool = True) -> list:
    """Reduce-scatter around ``order`` (member ids by ring position): the member at position
    ``p`` ends with the full reduction of ``blocks_of(p)``."""
    n = len(order)
    steps = []
    for s in range(n - 1):
        step = []
        for p in range(n):
            q, b = ((p + 1) % n, (p - s - 1) % n) if forward else ((p - 1) % n, (p + s + 1) % n)
            step.append(Xfer(order[p], order[q], blocks_of(b), True))
        steps.append(step)
    return steps


def ring_ag(order: list, blocks_of, forward: bool = True) -> list:
    """All-gather around ``order``: position ``p`` starts with ``blocks_of(p)``."""
    n = len(order)
    steps = []
    for s in range(n - 1):
        step = []
        for p in range(n):
            q, b = ((p + 1) % n, (p - s) % n) if forward else ((p - 1) % n, (p + s) % n)
            step.append(Xfer(order[p], order[q], blocks_of(b), False))
        steps.append(step)
    return steps


def chain(order: list, root_pos: int, blocks: tuple, forward: bool = True, length: int | None = None) -> list:
    """A broadcast chain from ``root_pos`` along ``order`` over ``length`` hops."""
    n = len(order)
    hops = n - 1 if length is None else length
    sgn = 1 if forward else -1
    return [[Xfer(order[(root_pos + sgn * p) % n], order[(root_pos + sgn * (p + 1)) % n], blocks, False)]
            for p in range(hops)]


def merge(*phases) -> list:
    """Run phases side by side: step k of the result is step k of every phase."""
    out: list = []
    for phase in phases:
        for k, step in enumerate(phase):
            if k == len(out):
                out.append([])
            out[k].extend(step)
    return out


def relabel(steps: list, order: list) -> list:
    """Blocks renamed so that block ``order[i]`` becomes block ``i``. NOTE: an all-reduce's
    block ids are free (every member holds and keeps all of them); in coordinate order
    (innermost dimension most significant) the blocks a member handles along each dimension
    are consecutive, so the kernel moves them as one packet instead of one per block."""
    new = {b: i for i, b in enumerate(order)}
    return [[Xfer(x.src, x.dst, tuple(sorted(new[b] for b in x.blocks)), x.reduce) for x in step] for step in steps]


def doubling_all_reduce(order: list, blocks: tuple) -> list:
    """Recursive doubling of ``blocks`` over ``order``; members beyond the largest power of
    two first fold into a partner and get the result back at the end."""
    n = len(order)
    p = 1 << (n.bit_length() - 1)
    extra = list(range(p, n))
    steps = [[Xfer(order[q], order[q - p], blocks, True) for q in extra]] if extra else []
    k = 1
    while k < p:
        steps.append([Xfer(order[q], order[q ^ k], blocks, True) for q in range(p)])
        k *= 2
    if extra:
        steps.append([Xfer(order[q - p], order[q], blocks, False) for q in extra])
    return steps
