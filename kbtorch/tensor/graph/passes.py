"""Graph mode's pass pipeline: the kernels of a captured graph to one timed schedule.

    fusion  ->  overlap  ->  shared copies  ->  join

- ``fusion``: the op kernels as fused kernels (a norm prologue, a vector epilogue, vector
  chains as one pass); one kernel per op when the graph's ``fuse`` is off;
- ``overlap``: a collective chunked under the GEMM it feeds or drains (``overlap`` on);
- ``shared_copies``: a tensor replicated over PEs that bind one memory kept as one copy;
- ``join``: the plan's programs as one program per PE, chained by semaphores, simulated in
  one run (in part, by periods, for a periodic graph).

Every pass reads only what each kernel declares (the op contract: ``Timed``, ``Timed.rows``,
``Timed.groups``), never a model's pattern. A new rewrite is one entry of ``REWRITES``.
"""
from __future__ import annotations

from . import fusion, join, overlap, periodic, shared_copies

#: The rewrites applied to the fused plan, in order: (name, whether it applies to a graph,
#: ``rewrite(graph, plan) -> plan``).
REWRITES = (
    ("overlap", lambda graph: graph.overlap, overlap.rewrite),
    ("shared copies", lambda graph: True, shared_copies.rewrite),
)


def plan(graph):
    """The fused plan of ``graph``, rewritten by each pass of ``REWRITES`` in turn."""
    plan = fusion.plan(graph) if graph.fuse else fusion.unfused(graph)
    for _, applies, rewrite in REWRITES:
        plan = rewrite(graph, plan) if applies(graph) else plan
    return plan


def schedule(graph, plan, machine):
    """The kernels of ``plan`` joined and simulated on ``machine`` (``join``): the schedule.
    A periodic graph (``graph.periodic``: the same kernel signatures repeating, one decoder
    layer after another) is simulated by periods; an order ``"ready"`` starts kernels by
    their estimated readiness (their own simulated latencies)."""
    progs, deps = [k.programs for k in plan.kernels], [k.deps for k in plan.kernels]
    late = [k.late for k in plan.kernels]
    est = [sum(graph.kernels[m].timed.result.latency_ps for m in k.members) for k in plan.kernels] \
        if graph.order == "ready" else None
    near = [frozenset(d for d in k.deps if _near(graph, plan.kernels[d], k)) for k in plan.kernels]
    per = periodic.period(fusion.signatures(graph, plan)) if graph.periodic else None
    if per:
        return periodic.simulate_periodic(progs, deps, machine, per, graph.mode, late, est, near)
    return join.simulate(progs, deps, machine, graph.mode, late, est, near)


def _vector_of(graph, k):
    """The vector pass a planned kernel runs (fused or alone), or None."""
    return k.vector or (getattr(graph.kernels[k.members[0]].timed.result, "vector", None)
                        if len(k.members) == 1 else None)


def _near(graph, d, k) -> bool:
    """Whether kernel ``k`` reads of kernel ``d``'s result on each PE only what ``d`` wrote on
    that PE, or a whole copy any one of its PEs holds (``join.build``'s ``near``): ``d`` a
    collective or a shared-copy barrier (each member holds its own result), a replicated
    vector pass (each PE the whole), or a vector pass over the PEs and split ``k``'s own
    vector pass takes. Anything else (a GEMM's tiles, attention's heads, a pass feeding a
    GEMM) waits for all of ``d`` (a barrier)."""
    if graph.kernels[d.members[0]].timed.groups or d.kernel.endswith("(shared copy)"):
        return True
    vd, vk = _vector_of(graph, d), _vector_of(graph, k)
    if vd is None or d.programs.keys() != set(vd.pes):
        return False
    if vd.copies == len(vd.pes):
        return True
    return vk is not None and (vk.pes, vk.copies, vk.n) == (vd.pes, vd.copies, round(vd.n * vd.out_ratio))
