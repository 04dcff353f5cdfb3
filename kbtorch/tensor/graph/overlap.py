"""Graph mode's overlap pass: a collective runs under the GEMM it feeds or drains, chunk by
chunk along the sequence (as async tensor parallelism does).

A rule over what every kernel declares (``Timed.rows``: how it splits along its rows),
applied to the fused plan (``fusion``), never a model's pattern: a GEMM kernel (plain or
with its epilogue) of M rows

- whose A operand its own op all-gathered just before (a collective of the GEMM's node,
  on a tensor of M rows: sequence parallelism's all-gather before a column-parallel GEMM),
- and/or whose result a collective of M rows reduces next (a reduce-scatter or all-reduce
  of the next op that reads the result: after a row-parallel GEMM)

is split into ``c`` chunks of M/c rows: gather i, GEMM i, reduce i. Each chunk is the same
kernel on fewer rows through its own op family (``Rows.run``: ``ops.gemm`` and the
collectives, cached; a fused epilogue rebuilt on the chunk's GEMM by ``gemm_fused.epilogue``);
no second implementation. Chunk i's GEMM waits only for gather i, reduce i only for GEMM i,
and kernels that used the whole wait for every chunk: the collective of one chunk runs in
the ONE simulation while the GEMM of its neighbour does, contending for links, HBM and
PEs as they physically do. Values are untouched: the pass rewrites the timing plan only.

The chunk count: the fewest-latency ``c`` of ``CHUNKS`` (M divisible by it, at least
``MIN_ROWS`` rows a chunk), by a small search on the estimate: each stage's chunk run
alone (simulated, launch excluded), pipelined as a flow shop (gather i+1 under GEMM i,
reduce i under GEMM i+1); no split when no ``c`` beats the kernels one after another. The
search stops at the first ``c`` that does not improve on the one before (the estimate
falls, then rises, as chunks get smaller). Contention is not in the estimate: the
simulation of the graph has it.
"""
from __future__ import annotations

import heapq
from dataclasses import replace
from types import SimpleNamespace

from . import fusion, gemm_fused

#: Chunk counts tried, in order (the search stops when one does not improve).
CHUNKS = (2, 4, 8, 16)
#: Fewest rows a chunk keeps.
MIN_ROWS = 2
#: Collective kinds that may run before (gather the GEMM's A) or after (reduce its C).
BEFORE = ("all_gather",)
AFTER = ("reduce_scatter", "all_reduce")


def _rows(graph, planned):
    """The ``Rows`` of a plan kernel with one member (or a GEMM head), else None."""
    return graph.kernels[planned.members[0]].timed.rows


def _pairs(graph, plan) -> dict:
    """{GEMM plan index: (gather plan index or None, reduce plan index or None)}."""
    kernels, found, used = plan.kernels, {}, set()
    users: dict = {}
    for i, k in enumerate(kernels):
        for d in k.deps:
            users.setdefault(d, []).append(i)
    for i, k in enumerate(kernels):
        rows = _rows(graph, k)
        if k.kernel not in ("gemm", "gemm+epilogue") or rows is None or rows.kind != "gemm" \
                or rows.count < 2 * MIN_ROWS:
            continue
        head = graph.kernels[k.members[0]]
        before = [d for d in sorted(k.deps) if d not in used and len(kernels[d].members) == 1
                  and (r := _rows(graph, kernels[d])) is not None and r.kind in BEFORE and r.count == rows.count
                  and graph.kernels[kernels[d].members[0]].node == head.node]
        out = graph.kernels[k.members[-1]].writes
        after = [u for u in users.get(i, ()) if u not in used and len(kernels[u].members) == 1
                 and (r := _rows(graph, kernels[u])) is not None and r.kind in AFTER and r.count == rows.count
                 and out & graph.kernels[kernels[u].members[0]].reads]
        pair = (before[-1] if before else None, after[0] if after else None)
        if pair != (None, None):
            found[i] = pair
            used.update(x for x in pair if x is not None)
    return found


def _alone_ps(machine, result) -> int:
    progs = result.programs or {}
    first = min((machine.launch_ps(pe) for pe in progs if progs[pe]), default=0)
    return max(1, result.latency_ps - first)


def flow_shop(stages: list) -> int:
    """The finish of ``c`` chunks through stages in order (each a list of chunk times):
    chunk i enters a stage when it left the one before and the stage's chunk i-1 left it."""
    done = [0] * len(stages[0])
    for times in stages:
        t = 0
        for i, x in enumerate(times):
            t = max(t, done[i]) + x
            done[i] = t
    return done[-1]


def _sizes(count: int, c: int) -> list:
    return [count // c] * c


def _stages(graph, kernels: list, c: int) -> list:
    """Per stage (gather, GEMM, reduce present), the chunk runs' alone times."""
    out = []
    for planned in kernels:
        rows = _rows(graph, planned)
        out.append([_alone_ps(graph.machine, rows.run(r)) for r in _sizes(rows.count, c)])
    return out


def chunks(graph, kernels: list) -> int:
    """The chunk count for the plan kernels ``kernels`` (gather?, GEMM, reduce?; module
    docstring): 1 for no split."""
    count = _rows(graph, kernels[0]).count          # NOTE: the same in every stage (``_pairs``)
    best, best_ps = 1, sum(_alone_ps(graph.machine, graph.kernels[k.members[0]].timed.result) for k in kernels)
    for c in CHUNKS:
        if count % c or count // c < MIN_ROWS:
            break
        ps = flow_shop(_stages(graph, kernels, c))
        if ps >= best_ps:
            break
        best, best_ps = c, ps
    return best


def _chunk(graph, planned, c: int, i: int, deps: frozenset, late: frozenset):
    """Chunk ``i`` of ``c`` of a plan kernel: its op family's run on its rows."""
    rows = _rows(graph, planned)
    size = rows.count // c
    result = rows.run(size)
    programs = result.programs
    if planned.kernel == "gemm+epilogue":
        vec, n, inputs, eb, flops, ratio = planned.epilogue
        programs = gemm_fused.epilogue(graph.machine, SimpleNamespace(result=result), vec, -(-n // c), inputs, eb, flops, ratio)
    return replace(planned, kernel=f"{planned.kernel} [chunk {i + 1}/{c}]", programs=programs, deps=deps,
                   late=late, flops=planned.flops // c + (planned.flops % c if i == c - 1 else 0),
                   detail=f"{planned.detail}; rows {i * size}-{(i + 1) * size - 1} of {rows.count}",
                   epilogue=())


def rewrite(graph, plan):
    """``plan`` with every GEMM beside a collective split into chunks (module docstring)."""
    pairs = _pairs(graph, plan)
    if not pairs:
        return plan
    kernels = plan.kernels
    split = {}                                  # plan index -> (c, role, gemm index)
    for g, (before, after) in pairs.items():
        group = [x for x in (before, g, after) if x is not None]
        c = chunks(graph, [kernels[x] for x in group])
        if c > 1:
            for x in group:
                split[x] = (c, g)
    if not split:
        return plan
    # NOTE: software-pipelined issue order: gather 1, then per chunk i: gather i+1, GEMM i,
    # reduce i (engines are in-order queues: a gather queued behind a reduce would wait).
    rank = {}
    for x in range(len(kernels)):
        if x not in split:
            rank[(x, None)] = (x, 0)
        elif split[x][1] == x:
            before, after = pairs[x]
            seq = [(before, 0)] if before is not None else []
            for i in range(split[x][0]):
                seq += [(before, i + 1)] if before is not None and i + 1 < split[x][0] else []
                seq += [(x, i)] + ([(after, i)] if after is not None else [])
            rank.update({key: (x, j) for j, key in enumerate(seq)})

    def whole(d):
        return {(d, None)} if d not in split else {(d, i) for i in range(split[d][0])}

    deps, late = {}, {}
    for key in rank:
        x, i = key
        k = kernels[x]
        g = split[x][1] if x in split else None
        step = {pairs[g][0]: x == g, g: x == pairs[g][1]} if g is not None else {}
        deps[key] = set().union(*(({(d, i)} if step.get(d) else whole(d)) for d in k.deps))
        late[key] = set().union(*(whole(d) for d in k.late))
    order = _topological(rank, deps)
    at = {key: n for n, key in enumerate(order)}
    out = []
    for key in order:
        x, i = key
        d, lt = frozenset(at[e] for e in deps[key]), frozenset(at[e] for e in late[key])
        out.append(replace(kernels[x], deps=d, late=lt) if i is None
                   else _chunk(graph, kernels[x], split[x][0], i, d, lt))
    return fusion.Plan(tuple(out), plan.key, plan.keep)


def _topological(rank: dict, deps: dict) -> list:
    """The kernels in ``rank`` order as far as their dependencies allow (each after those
    it depends on)."""
    users: dict = {}
    waiting = {key: len(ds) for key, ds in deps.items()}
    for key, ds in deps.items():
        for d in ds:
            users.setdefault(d, []).append(key)
    ready = [(rank[key], key) for key, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, key = heapq.heappop(ready)
        order.append(key)
        for u in users.get(key, ()):
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, (rank[u], u))
    return order
