"""Collective schedules: which member sends which blocks to whom, step by step, built by a
registered algorithm (``algorithms/``, one module each), checked (``verify``) and
interpreted on torch tensors (``reference``).

A collective over ``n`` members cuts each member's buffer into ``blocks`` equal blocks. A
schedule is a list of steps; a step is a list of ``Xfer`` (``steps``): member ``src`` sends
its current value of some blocks to member ``dst``, which either combines it with its own
(``reduce``) or takes it (copy). The transfers of a step read the values from before the
step.

The same schedule drives both passes: ``reference`` interprets it on torch tensors (the
living definition of what the kernel computes), and ``kernel`` turns it into per-PE
commands for the simulator. Member ``i`` of a reduce-scatter ends with block(s) ``i`` of
the result (torch's ``reduce_scatter_tensor`` order); an all-gather starts with member
``i`` holding block(s) ``i``.

All-to-all (``all_to_all``, MoE dispatch and combine): member ``s`` holds ``n`` blocks, block
``s * n + d`` for member ``d``; member ``d`` keeps blocks ``s * n + d`` in source order
(torch's ``all_to_all_single``).
"""
from __future__ import annotations

import torch

from .algorithms import ALGORITHMS, ALGOS
from .request import KINDS, OPS, ORDERS, CollectiveError
from .steps import Schedule, relabel

#: ``schedule``'s results by what they depend on. NOTE: a schedule does not depend on the
#: bytes, and a model's collectives run on a few groups with many sizes: the automatic
#: choice builds every algorithm's schedule for each new size (a ring over 288 members is
#: 287 steps of 288 transfers).
SCHEDULES: dict = {}
SCHEDULES_MAX = 128


def schedule(kind: str, algo: str, grid, root: int = 0, order: str = "rank") -> Schedule:
    """The schedule of collective ``kind`` by ``algo`` over the members of ``grid``.

    ``order`` of a reduce-scatter's or all-gather's member blocks: ``rank`` (member ``i``'s
    are blocks ``i``, torch's order) or ``grid`` (member ``i``'s are those of its rank in
    the grid's coordinate order, as the all-reduce's block ids: in ``2d`` the blocks a
    member handles at each step are then consecutive and move as one packet)."""
    if order not in ORDERS:
        raise CollectiveError(f"unknown block order '{order}' (known: {', '.join(ORDERS)})")
    if kind not in KINDS:
        raise CollectiveError(f"unknown collective '{kind}' (known: {', '.join(KINDS)})")
    if algo not in ALGORITHMS:
        raise CollectiveError(f"unknown algorithm '{algo}' (known: {', '.join(ALGOS)})")
    n = len(grid.order)
    if n < 2:
        raise CollectiveError(f"a collective needs at least two members, got a group of {n}")
    if not 0 <= root < n:
        raise CollectiveError(f"broadcast root {root} is not a member rank (0..{n - 1})")
    key = (kind, algo, grid.pes, grid.names, grid.dims, grid.coords, tuple(grid.order), grid.inner, root, order)
    got = SCHEDULES.get(key)
    if got is None:
        if len(SCHEDULES) >= SCHEDULES_MAX:
            SCHEDULES.clear()
        got = SCHEDULES[key] = _schedule(kind, algo, grid, root, order)
    return got


def _schedule(kind: str, algo: str, grid, root: int, order: str) -> Schedule:
    n = len(grid.order)
    blocks, steps = ALGORITHMS[algo].build(kind, grid, root)
    per = blocks // n
    everything = tuple(range(blocks))
    rank = list(range(n))
    if order == "grid" and kind in ("reduce_scatter", "all_gather"):
        by_coords = sorted(range(n), key=lambda m: grid.coords[m])
        steps = relabel(steps, [m * per + j for m in by_coords for j in range(per)])
        for i, m in enumerate(by_coords):
            rank[m] = i
    own = tuple(tuple(range(rank[m] * per, (rank[m] + 1) * per)) for m in range(n))
    holds = {"all_reduce": (everything,) * n, "reduce_scatter": (everything,) * n, "all_gather": own,
             "broadcast": tuple(everything if m == root else () for m in range(n)), "all_to_all": own}[kind]
    keeps = own if kind == "reduce_scatter" else (everything,) * n
    if kind == "all_to_all":
        keeps = tuple(tuple(s * n + m for s in range(n)) for m in range(n))
    return Schedule(kind, algo, n, blocks, tuple(tuple(s) for s in steps if s), holds, keeps)


def verify(sched: Schedule) -> None:
    """Check symbolically that every output block combines every member exactly once
    (reductions) or is a copy of the root's (broadcast); raise CollectiveError if not."""
    everyone = (1 << sched.n) - 1
    known = [{b: (1 << m if sched.kind != "broadcast" else everyone) for b in sched.holds[m]} for m in range(sched.n)]
    if sched.kind == "all_gather":
        known = [{b: everyone for b in sched.holds[m]} for m in range(sched.n)]
    for k, step in enumerate(sched.steps):
        new = [dict(v) for v in known]
        for x in step:
            for b in x.blocks:
                if b not in known[x.src]:
                    raise CollectiveError(f"{sched.algo} step {k}: member {x.src} sends block {b} it does not have")
                if x.reduce:
                    mine = new[x.dst].get(b, 0)
                    if mine & known[x.src][b]:
                        raise CollectiveError(f"{sched.algo} step {k}: block {b} counted twice at member {x.dst}")
                    new[x.dst][b] = mine | known[x.src][b]
                else:
                    new[x.dst][b] = known[x.src][b]
        known = new
    for m in range(sched.n):
        for b in sched.keeps[m]:
            if sched.kind == "all_to_all":
                if known[m].get(b) != 1 << (b // sched.n):
                    raise CollectiveError(f"{sched.algo} all_to_all: member {m} ends without block {b} of member "
                                          f"{b // sched.n}")
            elif known[m].get(b) != everyone:
                raise CollectiveError(f"{sched.algo} {sched.kind}: member {m} ends with an incomplete block {b}")


def reference(sched: Schedule, inputs: list, op: str = "sum") -> list:
    """Interpret ``sched`` on torch tensors: ``inputs[m]`` is member m's input (the whole
    buffer; for all-gather its own part) -> each member's output, in the inputs' dtype."""
    if op not in OPS:
        raise CollectiveError(f"unknown reduction '{op}' (known: {', '.join(OPS)})")
    n, nb = sched.n, sched.blocks
    flat = [x.reshape(-1) for x in inputs]
    total = flat[0].numel() * (n if sched.kind in ("all_gather", "all_to_all") else 1)
    if total % nb:
        raise CollectiveError(f"{sched.algo}: {total} elements per member do not split into {nb} equal blocks")
    vals = []
    for m in range(n):
        v = torch.full((nb, total // nb), float("nan"), dtype=flat[0].dtype)
        if sched.holds[m]:
            v[list(sched.holds[m])] = flat[m].reshape(len(sched.holds[m]), -1)
        vals.append(v)
    fn = OPS[op]
    for step in sched.steps:
        new = [v.clone() for v in vals]
        for x in step:
            b0, b1 = x.blocks[0], x.blocks[-1] + 1
            idx = slice(b0, b1) if b1 - b0 == len(x.blocks) else list(x.blocks)
            new[x.dst][idx] = fn(new[x.dst][idx], vals[x.src][idx]) if x.reduce else vals[x.src][idx]
        vals = new
    return [vals[m][list(sched.keeps[m])].reshape(-1) for m in range(n)]


def pad(shards: list, nbytes: int, op: str) -> list:
    """Each member's buffer flattened and padded to ``nbytes`` with the reduction's identity."""
    fill = 0.0 if op == "sum" else float("-inf")
    out = []
    for t in shards:
        flat = t.reshape(-1)
        extra = nbytes // flat.element_size() - flat.numel()
        out.append(torch.cat([flat, flat.new_full((extra,), fill)]) if extra else flat)
    return out
