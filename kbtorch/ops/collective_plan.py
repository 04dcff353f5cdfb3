"""Collective schedules: which member sends which blocks to whom, step by step.

A collective over ``n`` members cuts each member's buffer into ``blocks`` equal blocks. A
schedule is a list of steps; a step is a list of ``Xfer``: member ``src`` sends its current
value of some blocks to member ``dst``, which either combines it with its own (``reduce``)
or takes it (copy). The transfers of a step read the values from before the step.

The same schedule drives both passes: ``reference`` interprets it on torch tensors (the
living definition of what the kernel computes), and ``collective_kernel`` turns it into
per-PE commands for the simulator. Member ``i`` of a reduce-scatter ends with block(s) ``i``
of the result (torch's ``reduce_scatter_tensor`` order); an all-gather starts with member
``i`` holding block(s) ``i``.

Algorithms (``ALGOS``):
- ``ring``: reduce-scatter then all-gather around one ring (``n - 1`` steps each);
- ``bidir-ring``: half of every block clockwise, the other half counter-clockwise;
- ``2d``: the multi-dimensional ring: reduce-scatter along each dimension of the group's
  grid in turn (the data shrinks by that dimension's size each time), all-gather back in
  reverse order; with one dimension it is the ring;
- ``direct``: one shot, every member sends each block straight to the member that needs it;
- ``tree``: recursive doubling (all-reduce exchanges the whole buffer, ``log2 n`` steps),
  recursive halving for reduce-scatter, a binomial tree for broadcast;
- ``hier``: hierarchical all-reduce: reduce-scatter inside each line of the innermost grid
  dimension (on a system of chips: inside each chip), recursive doubling of each share
  across the lines (chips), all-gather back; between chips (no grid dimension inside a
  chip) the all-gather sends directly along each grid dimension, outer first, forwarding
  what arrived along the dimensions below, the reduce-scatter is that all-gather run
  backwards, and the all-reduce is the reduce-scatter, then the all-gather (other kinds,
  and all three inside a chip, as ``2d``).

All-to-all (``all_to_all``, MoE dispatch and combine): member ``s`` holds ``n`` blocks, block
``s * n + d`` for member ``d``; member ``d`` keeps blocks ``s * n + d`` in source order
(torch's ``all_to_all_single``). ``direct``: every block straight to its member in one step;
``ring``: pairwise shifts, at step ``k`` each member sends to the member ``k`` ring positions
ahead (``n - 1`` steps, one peer per step); ``2d`` and ``hier``: one direct phase per grid
dimension (on a system: inside the chip first), each block moving along one dimension at a
time, so a member talks only to the members of its lines.

The schedule types and the phases the algorithms share are in ``collective_schedule``;
``2d`` and ``hier`` are in ``collective_hier``.
"""
from __future__ import annotations

import torch

from .collective_hier import hierarchical, multi_dim
from .collective_schedule import (ALGOS, KINDS, OPS, ORDERS, CollectiveError, Schedule, Xfer, _chain,
                                  _doubling_all_reduce, _merge, _relabel, _ring_ag, _ring_rs)


def _a2a_direct(grid) -> tuple[int, list]:
    n = len(grid.order)
    return n * n, [[Xfer(s, d, (s * n + d,), False) for s in range(n) for d in range(n) if d != s]]


def _a2a_shift(grid) -> tuple[int, list]:
    order, n = grid.order, len(grid.order)
    return n * n, [[Xfer(order[p], order[(p + k) % n], (order[p] * n + order[(p + k) % n],), False) for p in range(n)]
                   for k in range(1, n)]


def ring(kind: str, grid, root: int) -> tuple[int, list]:
    if kind == "all_to_all":
        return _a2a_shift(grid)
    order = grid.order
    if kind == "broadcast":
        return 1, _chain(order, order.index(root), (0,))
    own = lambda p: (order[p],)  # noqa: E731
    rs = _ring_rs(order, own) if kind != "all_gather" else []
    ag = _ring_ag(order, own) if kind != "reduce_scatter" else []
    return len(order), rs + ag


def bidir_ring(kind: str, grid, root: int) -> tuple[int, list]:
    """Blocks ``2i`` travel clockwise, blocks ``2i + 1`` counter-clockwise."""
    order, n = grid.order, len(grid.order)
    if kind == "all_to_all":
        raise CollectiveError("algorithm 'bidir-ring' does not apply to all_to_all (use ring, direct, 2d or hier)")
    if kind == "broadcast":
        r = order.index(root)
        return 2, _merge(_chain(order, r, (0,), True), _chain(order, r, (1,), False))
    cw = lambda p: (2 * order[p],)  # noqa: E731
    ccw = lambda p: (2 * order[p] + 1,)  # noqa: E731
    steps = []
    if kind != "all_gather":
        steps += _merge(_ring_rs(order, cw), _ring_rs(order, ccw, forward=False))
    if kind != "reduce_scatter":
        steps += _merge(_ring_ag(order, cw), _ring_ag(order, ccw, forward=False))
    return 2 * n, steps


def direct(kind: str, grid, root: int) -> tuple[int, list]:
    n = len(grid.order)
    if kind == "all_to_all":
        return _a2a_direct(grid)
    if kind == "broadcast":
        return 1, [[Xfer(root, m, (0,), False) for m in range(n) if m != root]]
    rs = [[Xfer(s, d, (d,), True) for s in range(n) for d in range(n) if d != s]]
    ag = [[Xfer(s, d, (s,), False) for s in range(n) for d in range(n) if d != s]]
    return n, (rs if kind != "all_gather" else []) + (ag if kind != "reduce_scatter" else [])


def tree(kind: str, grid, root: int) -> tuple[int, list]:
    """Recursive doubling / halving over ring positions (partners at distance 1, 2, 4, ...)."""
    order, n = grid.order, len(grid.order)
    if kind == "all_to_all":
        raise CollectiveError("algorithm 'tree' does not apply to all_to_all (use ring, direct, 2d or hier)")
    if kind == "broadcast":
        r, steps, k = order.index(root), [], 1
        while k < n:
            steps.append([Xfer(order[(r + q) % n], order[(r + q + k) % n], (0,), False) for q in range(k) if q + k < n])
            k *= 2
        return 1, steps
    if kind == "all_reduce":
        return 1, _doubling_all_reduce(order, (0,))
    if n & (n - 1):
        raise CollectiveError(f"algorithm 'tree' {kind} needs a power-of-two group, got {n} members")
    bits = n.bit_length() - 1
    steps = []
    if kind == "reduce_scatter":
        for k in reversed(range(bits)):
            steps.append([Xfer(order[q], order[q ^ (1 << k)], tuple(sorted(
                order[x] for x in range(n) if x >> (k + 1) == q >> (k + 1) and (x >> k) & 1 != (q >> k) & 1)), True)
                for q in range(n)])
    else:
        for k in range(bits):
            steps.append([Xfer(order[q], order[q ^ (1 << k)], tuple(sorted(
                order[x] for x in range(n) if x >> k == q >> k)), False) for q in range(n)])
    return n, steps


#: ``schedule``'s results by what they depend on. NOTE: a schedule does not depend on the
#: bytes, and a model's collectives run on a few groups with many sizes: the automatic
#: choice builds every algorithm's schedule for each new size (a ring over 288 members is
#: 287 steps of 288 transfers).
SCHEDULES: dict = {}
SCHEDULES_MAX = 128


BUILDERS = {"ring": ring, "bidir-ring": bidir_ring, "2d": multi_dim, "direct": direct, "tree": tree,
            "hier": hierarchical}


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
    if algo not in BUILDERS:
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
    blocks, steps = BUILDERS[algo](kind, grid, root)
    per = blocks // n
    everything = tuple(range(blocks))
    rank = list(range(n))
    if order == "grid" and kind in ("reduce_scatter", "all_gather"):
        by_coords = sorted(range(n), key=lambda m: grid.coords[m])
        steps = _relabel(steps, [m * per + j for m in by_coords for j in range(per)])
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
