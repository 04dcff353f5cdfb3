"""Periodic graphs: a model's layers, the same block of kernels repeating, simulated with
three repeats in one run and the rest following at the period that run measured
(docs/model.md, Graph mode, "Periodic graphs")."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...kernel import steady
from .join import Scheduled, simulate


#: Repeats of a periodic graph simulated in full (the rest follow at the measured period; at
#: least 3: two periods, their change is the record's claim).
REPEATS_SIMULATED = 3
#: Fewest repeats for the periodic shortcut.
REPEATS_MIN = 5


@dataclass(frozen=True)
class Period:
    """A run of ``count`` identical blocks of ``length`` kernels from kernel ``start``."""

    start: int
    length: int
    count: int


def same(signatures: list, i: int, p: int) -> bool:
    """Whether kernel ``i + p`` repeats kernel ``i`` one block of ``p`` kernels on: it runs
    the same and each of its dependencies is the counterpart of one of ``i``'s one block on,
    or the very same kernel (an input shared by every block)."""
    (what, deps), (what2, deps2) = signatures[i], signatures[i + p]
    if what != what2 or len(deps) != len(deps2):
        return False
    return all(d + p in deps2 or d in deps2 for d in deps)


def period(signatures: list) -> Period | None:
    """The repeated block covering most kernels (a model's layers), or None.

    ``signatures``: per kernel, (what it runs, the kernels it depends on) (``fusion``'s)."""
    n, best = len(signatures), None
    for p in range(1, n // REPEATS_MIN + 1):
        i = 0
        while i + p < n:
            if not same(signatures, i, p):
                i += 1
                continue
            j = i
            while j + p < n and same(signatures, j, p):
                j += 1
            count = (j - i) // p + 1
            if count >= REPEATS_MIN and (best is None or count * p > best.count * best.length):
                best = Period(i, p, count)
            i = j + 1
    return best


def simulate_periodic(kernels: list, deps: list, machine, per: Period, mode: str = "auto",
                      late: list | None = None, est_ps: list | None = None,
                      near: list | None = None) -> Scheduled:
    """A graph of ``per.count`` identical blocks: the prefix, ``REPEATS_SIMULATED`` blocks and
    the suffix simulated together in ONE run; the other blocks follow at the period the run
    measured between its last two blocks (their spans are the last block's, shifted).

    NOTE: a steady state: block i+1 starts as block i drains, the same in every block once
    the pipeline is full; the shortcut is exact when the simulated blocks already repeat."""
    k = REPEATS_SIMULATED
    assert k >= 3, "REPEATS_SIMULATED: two periods are needed for the record's claim"
    cut, resume = per.start + k * per.length, per.start + per.count * per.length

    keep = list(range(cut)) + list(range(resume, len(kernels)))
    last = range(per.start + (k - 1) * per.length, cut)
    prev = range(per.start + (k - 2) * per.length, per.start + (k - 1) * per.length)
    sub = [frozenset(_fold(d, per, cut, resume) for d in deps[i]) for i in keep]
    sub_late = [frozenset(_fold(d, per, cut, resume) for d in late[i]) for i in keep] if late else None
    # NOTE: the first two simulated blocks' commands are marked (0, 1): the run keeps the
    # counters as they stand when each block's last command completes, one period apart, each
    # with the next block in flight as in the steady state (the last block has none after it).
    first = range(prev.start - per.length, prev.start)
    marked = {i: m for m, blk in enumerate((first, prev)) for i in blk}
    run = simulate([_marked(kernels[i], marked[i]) if i in marked else kernels[i] for i in keep], sub, machine, mode,
                   sub_late, [est_ps[i] for i in keep] if est_ps else None,
                   [frozenset(_fold(d, per, cut, resume) for d in near[i]) for i in keep] if near else None,
                   snapshots=frozenset((0, 1)))
    # the last kernel to finish in each of the last two simulated blocks
    end0, end1 = (max(blk, key=lambda i: run.finish_ps[i]) for blk in (prev, last))
    step = run.finish_ps[end1] - run.finish_ps[end0]
    extra = (per.count - k) * step
    ready, finish = list(run.ready_ps[:cut]), list(run.finish_ps[:cut])
    for b in range(k, per.count):
        shift = (b - k + 1) * step
        ready += [run.ready_ps[i] + shift for i in last]
        finish += [run.finish_ps[i] + shift for i in last]
    ready += [t + extra for t in run.ready_ps[cut:]]
    finish += [t + extra for t in run.finish_ps[cut:]]
    before = run.finish_ps[end0] - max(run.finish_ps[i] for i in first)
    run.result.latency_ps += extra
    snaps = run.result.mark_stats
    if 0 in snaps and 1 in snaps:
        # the skipped blocks' counters: the growth of the counters over the last simulated period, per block
        run.result.stats = steady.stats_grown(run.result.stats, snaps[0], snaps[1], per.count - k)
    # NOTE: the skipped blocks' time is attributed where the last simulated block's went (its
    # growth from the block before), so the chain still adds up to the latency.
    if extra > 0:
        run.result.chain = steady.attributed(run.chains[end0], run.chains[end1], run.result.chain, extra)
    run.result.extrapolated = (per, step)
    # NOTE: the record: blocks skipped (their events estimated per kernel kept), and as the
    # claimed error the change d between the last two simulated periods as a drift of d per
    # block over the n skipped ones: d n (n + 1) / 2.
    r, n = run.result, per.count - k
    r.obtained = replace(r.obtained, method="periodic", repeats_skipped=n, skipped_ps=extra,
                         events_skipped=round(r.events * n * per.length / len(keep)), samples=(k,),
                         error_bound=abs(step - before) * n * (n + 1) / 2 / r.latency_ps)
    return Scheduled(run.result, tuple(ready), tuple(finish), run.commands)


def _marked(kernel: dict, mark: int) -> dict:
    """Kernel ``{pe: [commands]}`` with every command carrying ``mark``."""
    return {pe: [replace(c, mark=mark) for c in cmds] for pe, cmds in kernel.items()}


def _fold(d: int, per: Period, cut: int, resume: int) -> int:
    """Kernel ``d`` of the full graph as a kernel of the shortened one: a skipped block's
    kernel as its counterpart in the last simulated block; the suffix moved up."""
    if d < cut:
        return d
    if d >= resume:
        return d - (resume - cut)
    return cut - per.length + (d - per.start) % per.length
