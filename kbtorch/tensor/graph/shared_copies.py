"""Graph mode's shared copies: a tensor replicated over PEs that bind ONE memory (the tiles
of a die-wide HBM, as on a Maia 200 chip) is one copy there, as a stack that knows the
layout keeps it.

A rule over what each collective kernel declares (``Timed.groups``), applied to the timed
plan after fusion and overlap, never a model's pattern: an all-gather whose every group
binds one memory moves no data, since each member's part already lies in the memory all
of them read. Its members only wait for each other: a barrier, in which every member
tells its group's first PE by an IPCQ message that its part is written, and that PE,
once told by all, tells each of them. Kernels that read the gathered tensor then follow
the barrier as they followed the gather (``scheduler``: through semaphores on the PEs).

Likewise a pointwise pass (or a fused chain of them) that eager mode runs whole on every PE
of a replicated tensor (``VectorPass.copies``) is run ONCE per memory: the PEs that share one split it, each
writing its part of the one copy, then meet at the same barrier before anything reads it.

NOTE: eager mode keeps a copy per PE (its figures are the baseline graph mode is compared
with); on machines whose PEs each own a memory (AHBM's HBM slices) no group qualifies and
nothing changes. Values are untouched: the pass rewrites the timing plan only.
"""
from __future__ import annotations

from dataclasses import replace

from ...kernel import by_fidelity
from ...kernel import run_programs
from ...ops.vector import pass_mode
from ...kernel.door import Fetch, Send, Signal, Wait
from . import fusion
from ... import state


#: Kernels of pointwise passes (their parts split anywhere; a row reduction's would need its rows).
POINTWISE = ("elementwise", "copy")


def one_memory(machine, groups: tuple) -> bool:
    """Whether every group's PEs bind the same memory."""
    return bool(groups) and all(len(memories(machine, g)) == 1 for g in groups)


def barrier(groups: tuple, after: frozenset = frozenset()) -> dict:
    """``{pe: [commands]}``: each group's members tell its first PE they are there, which,
    told by all, tells each of them (semaphores ``arrive`` and ``release``); the PEs of
    ``after`` first wait for their own ``part`` semaphore (their share of a pass written)."""
    programs = {}
    for g in groups:
        root, others = g[0], g[1:]
        own = (Wait("part", 1, 0),) if root in after else ()
        everyone = (Wait("arrive", len(others), 0),) + own
        met = (Wait("met", 1, 0),)
        programs[root] = [Fetch(1, engine="math", waits=everyone, signals=(Signal("met"),),
                                label="barrier: all parts written")]
        programs[root] += [Send(dst_pe=p, sem="release", waits=met if i == 0 else (),
                                label=f"barrier: release PE {p}") for i, p in enumerate(others)]
        for p in others:
            own = (Wait("part", 1, 0),) if p in after else ()
            programs[p] = [Send(dst_pe=root, sem="arrive", waits=own, label=f"barrier: PE {p} part written"),
                           Fetch(1, engine="math", waits=(Wait("release", 1, 0),), label="barrier: released")]
    return programs


def memories(machine, pes) -> tuple:
    """``pes`` grouped by the memory they bind, in order."""
    out: dict = {}
    for p in pes:
        out.setdefault(machine.pes[p].hbm, []).append(p)
    return tuple(tuple(g) for g in out.values())


@state.cache


@by_fidelity(1024)
def split_pass(machine, vec) -> tuple | None:
    """(programs, latency alone in ps) of a replicated vector pass run once per memory
    (module docstring), or None when it is not replicated or no two of its PEs share a
    memory."""
    if vec is None:
        return None
    groups = memories(machine, vec.pes)
    if vec.copies != len(vec.pes) or len(groups) == len(vec.pes):
        return None
    once = vec.n // vec.copies * len(groups)
    progs = vec.programs(machine, once, name=f"{vec.op} (shared copy)")
    working = frozenset(pe for pe, cmds in progs.items() if cmds)
    for pe in working:
        last = progs[pe][-1]
        if len(last.signals) > 1:
            progs[pe] = progs[pe] + [Fetch(1, engine="math", signals=(Signal("part"),), label="pass written")]
        else:
            progs[pe] = progs[pe][:-1] + [replace(last, signals=last.signals + (Signal("part"),))]
    meet = barrier(groups, working)
    split = {pe: list(progs.get(pe, [])) + meet.get(pe, []) for pe in vec.pes}
    return split, _alone_ps(machine, split)


@state.cache


@by_fidelity(1024)
def _whole_ps(machine, vec) -> int:
    """Latency alone of a fused pass run whole on every PE: the programs ``fusion`` built
    from the same parameters, simulated once per pass, not at every rewrite."""
    return _alone_ps(machine, vec.programs(machine, name=f"fused {vec.op}"))


def _alone_ps(machine, programs: dict) -> int:
    return run_programs(programs, machine, mode=pass_mode("auto", machine)).latency_ps


def rewrite(graph, plan):
    """``plan`` with every all-gather inside one memory a barrier and every replicated
    pointwise pass there split once per memory where that is faster (module docstring)."""
    kernels, machine = list(plan.kernels), graph.machine
    for i, k in enumerate(kernels):
        timed = graph.kernels[k.members[0]].timed
        if len(k.members) == 1 and timed.kernel.startswith("all_gather") and one_memory(machine, timed.groups):
            kernels[i] = replace(k, programs=barrier(timed.groups), kernel="barrier (shared copy)",
                                 detail=f"{k.detail}; an all-gather inside one memory: no data moves")
        elif all(graph.kernels[m].timed.kernel.startswith(POINTWISE) for m in k.members):
            fused = len(k.members) > 1
            got = split_pass(machine, k.vector if fused else getattr(timed.result, "vector", None))
            # NOTE: split only when faster alone than the whole pass on every PE: a tiny pass
            # stays whole (the barrier would cost more), as a stack would choose.
            if got is not None and got[1] < (_whole_ps(machine, k.vector) if fused else timed.result.latency_ps):
                kernels[i] = replace(k, programs=got[0], kernel=f"{k.kernel} (shared copy)",
                                     detail=f"{k.detail}; once per memory, split over its PEs")
    return fusion.Plan(tuple(kernels), plan.key, plan.keep)
