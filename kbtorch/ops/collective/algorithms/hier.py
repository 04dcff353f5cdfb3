"""``hier``: the hierarchical all-reduce: reduce-scatter inside each line of the innermost
grid dimension (on a system of chips: inside each chip), recursive doubling of each share
across the lines (chips), all-gather back; between chips (no grid dimension inside a chip)
the all-gather sends directly along each grid dimension, outer first, forwarding what
arrived along the dimensions below (``_dims_direct_ag``), the reduce-scatter is that
all-gather run backwards, and the all-reduce is the reduce-scatter, then the all-gather
(other kinds, and all three inside a chip, as ``2d``; an all-to-all by ``2d``'s phases, the
chip's dimensions first). Its phases: reduce-scatter/all-gather inside one line by
halving/doubling (``_line_rs_ag``) and the hierarchical all-reduce inside chips then across
them (``_chip_hierarchical``)."""
from __future__ import annotations

from ..steps import Xfer, doubling_all_reduce, merge, ring_ag, ring_rs
from .multi_dim import a2a_dims, multi_dim
from .registry import algorithm


def _line_rs_ag(line: list) -> tuple[list, list]:
    """(reduce-scatter, all-gather) inside ``line``, block ``i`` ending at position ``i``:
    recursive halving/doubling when its length is a power of two, else the ring."""
    n = len(line)
    if n & (n - 1):
        own = lambda p: (p,)  # noqa: E731
        return ring_rs(line, own), ring_ag(line, own)
    bits = n.bit_length() - 1
    rs = [[Xfer(line[q], line[q ^ (1 << k)], tuple(x for x in range(n) if x >> (k + 1) == q >> (k + 1)
                                                   and (x >> k) & 1 != (q >> k) & 1), True) for q in range(n)]
          for k in reversed(range(bits))]
    ag = [[Xfer(line[q], line[q ^ (1 << k)], tuple(x for x in range(n) if x >> k == q >> k), False)
           for q in range(n)] for k in range(bits)]
    return rs, ag


@algorithm("hier", rank=5)
def hierarchical(kind: str, grid, root: int) -> tuple[int, list]:
    """All-reduce in three phases around the grid's innermost dimension (the PEs of a CUBE
    on AHBM): reduce-scatter inside each line of it (block ``i`` to position ``i``), then an
    all-reduce of block ``i`` by recursive doubling among the members at position ``i``
    (snake order), then all-gather back inside each line. Only a line's share of the data
    crosses between lines. Between chips (``grid.inner == 0``): an all-gather is
    ``_dims_direct_ag``, a reduce-scatter the same backwards, an all-reduce both.
    Other kinds, and one-dimensional groups, as ``2d``."""
    inner = grid.inner
    if kind in ("all_gather", "all_reduce", "reduce_scatter") and len(grid.dims) > 1 and grid.inner == 0:
        # NOTE: between chips only (no grid dimension inside a chip); inside a chip as 2d.
        ag = _dims_direct_ag(grid)
        if kind == "all_gather":
            return len(grid.order), ag
        # the reduce-scatter is the all-gather run backwards: each transfer sends the partial
        # sum of the members its copy reached, the receiver adds it (so each link carries
        # the all-gather's blocks, the other way)
        rs = [[Xfer(x.dst, x.src, x.blocks, True) for x in step] for step in reversed(ag)]
        return len(grid.order), rs + (ag if kind == "all_reduce" else [])
    if kind == "all_to_all" and len(grid.dims) > 1:
        return a2a_dims(grid, [list(range(inner)), list(range(inner, len(grid.dims)))])
    if kind != "all_reduce" or len(grid.dims) < 2 or inner == len(grid.dims):
        return multi_dim(kind, grid, root)
    if inner > 1:
        return _chip_hierarchical(grid, inner)
    n0 = grid.dims[0]
    lines = sorted({tuple(grid.line(m, 0)) for m in range(len(grid.order))})
    phases = [_line_rs_ag(list(line)) for line in lines]
    outer = [doubling_all_reduce([m for m in grid.order if grid.coords[m][0] == c], (c,)) for c in range(n0)]
    return n0, merge(*(rs for rs, _ in phases)) + merge(*outer) + merge(*(ag for _, ag in phases))


def _dims_direct_ag(grid) -> list:
    """All-gather by direct sends along the grid's lines, outer dimensions first: at step 0
    every member sends its block to every member of each of its lines; a block that arrived
    along dimension ``j`` goes on to the member's line of each dimension below ``j`` at the
    next step. Each block reaches each member once, by the dimension-ordered path (``len(dims)``
    steps); every link of a member carries blocks it needs itself, so a system of chips uses
    its tray links and its switch ports at once (direct sends every cross-tray block over the
    switch; ring and 2d send one block at a time)."""
    n, dims = len(grid.order), len(grid.dims)
    steps, fresh = [], [{j: (m,) for j in range(dims)} for m in range(n)]
    while any(fresh):
        step, nxt = [], [{} for _ in range(n)]
        for m in range(n):
            for j, blocks in sorted(fresh[m].items()):
                for d in grid.line(m, j):
                    if d != m:
                        step.append(Xfer(m, d, blocks, False))
                        for k in range(j):
                            nxt[d][k] = tuple(sorted(nxt[d].get(k, ()) + blocks))
        steps.append(step)
        fresh = nxt
    return steps


def _chip_hierarchical(grid, inner: int) -> tuple[int, list]:
    """``hier`` all-reduce with the first ``inner`` grid dimensions inside one unit (a chip):
    reduce-scatter inside each unit (its members in snake order), recursive doubling of
    share ``i`` among the members at position ``i`` of every unit, all-gather back."""
    units: dict = {}
    for m in grid.order:
        units.setdefault(grid.coords[m][inner:], []).append(m)
    lines = list(units.values())
    phases = [_line_rs_ag(line) for line in lines]
    outer = [doubling_all_reduce([line[i] for line in lines], (i,)) for i in range(len(lines[0]))]
    return len(lines[0]), merge(*(rs for rs, _ in phases)) + merge(*outer) + merge(*(ag for _, ag in phases))
