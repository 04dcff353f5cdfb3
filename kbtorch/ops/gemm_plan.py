"""GEMM decomposition: which PE computes which block, in which tiles.

``C[M,N] = A[M,K] @ B[K,N]`` on a group of P PEs laid out as a ``gm x gn x gk`` grid (PE
rank ``r = (a * gn + b) * gk + c``: the ``gk`` PEs that split one output block's K range
are neighbours). PE ``(a, b, c)`` owns rows ``a`` of M, columns ``b`` of N and the K range
``c`` (balanced splits; edge blocks are smaller). Inside its block a PE walks output tiles
of ``tm x tn`` (row-major), each accumulating over K in steps of ``tk`` (the last step may be
shorter). With ``gk > 1`` the PE with ``c = 0`` owns the block and sums the others'
partial results; with ``partial`` tilings the K split's partial results stay on their
PEs instead (each PE its own group: C is their sum, as a row-parallel layer leaves it).

Operand placement (the kernel's deploy): each PE's A panel ``[M_a, K_c]``, B panel
``[K_c, N_b]`` and C block sit in its own HBM slice in a blocked layout (every tile
contiguous), i.e. A row panels are replicated across a grid row and B column panels
across a grid column, as after an all-gather; the cost of getting them there belongs to the
collectives, not to the GEMM.
"""
from __future__ import annotations

from dataclasses import dataclass

from .contract import dtype_of



@dataclass(frozen=True)
class GemmTiling:
    """PE grid ``(gm, gn, gk)`` and macro-tile ``(tm, tn, tk)``; ``partial``: the K split's
    partial results are left on their PEs, not summed."""

    grid: tuple
    tile: tuple
    partial: bool = False

    def describe(self) -> str:
        text = f"grid {'x'.join(map(str, self.grid))}, tile {'x'.join(map(str, self.tile))}"
        return text + (", partial" if self.partial else "")


@dataclass(frozen=True)
class Block:
    """One PE's part of a GEMM: its ranges, its K group and the owner of its output block."""

    pe: int
    rank: int
    m: tuple
    n: tuple
    k: tuple
    peers: tuple
    owner: int

    @property
    def shape(self) -> tuple:
        return self.m[1] - self.m[0], self.n[1] - self.n[0], self.k[1] - self.k[0]


def split(total: int, parts: int, i: int) -> tuple[int, int]:
    """The ``i``-th of ``parts`` balanced ranges of ``range(total)``."""
    base, extra = divmod(total, parts)
    lo = i * base + min(i, extra)
    return lo, lo + base + (1 if i < extra else 0)


def steps(length: int, size: int) -> list[int]:
    """Tile sizes covering ``length`` in steps of ``size`` (the last may be shorter)."""
    return [min(size, length - x) for x in range(0, length, size)]


def check_shape(m: int, n: int, k: int, dtype: str) -> None:
    dtype_of(dtype, "gemm")
    bad = [f"{name}={x!r}" for name, x in (("M", m), ("N", n), ("K", k)) if isinstance(x, bool) or not isinstance(x, int)]
    if bad:
        raise TypeError(f"gemm: shape {', '.join(bad)} must be ints")
    if min(m, n, k) < 1:
        raise ValueError(f"gemm: shape M={m} N={n} K={k} must be positive")


def plan(m: int, n: int, k: int, pes: list, tiling: GemmTiling) -> list[Block]:
    """The shards of every PE in ``pes`` (PEs without work get none)."""
    gm, gn, gk = tiling.grid
    if gm * gn * gk != len(pes):
        raise ValueError(f"gemm: grid {tiling.grid} has {gm * gn * gk} PEs but the group has {len(pes)}")
    if gm > m or gn > n or gk > k:
        raise ValueError(f"gemm: grid {tiling.grid} is larger than the problem M={m} N={n} K={k}")
    if min(tiling.tile) < 1:
        raise ValueError(f"gemm: tile {tiling.tile} must be positive")
    shards = []
    for a in range(gm):
        for b in range(gn):
            group = [pes[(a * gn + b) * gk + c] for c in range(gk)]
            for c in range(gk):
                r = (a * gn + b) * gk + c
                peers = (pes[r],) if tiling.partial else tuple(group)
                shards.append(Block(pes[r], r, split(m, gm, a), split(n, gn, b), split(k, gk, c), peers, peers[0]))
    return shards


def output_tiles(shard: Block, tiling: GemmTiling) -> list[tuple[int, int, int, int]]:
    """``(row offset, rows, column offset, columns)`` of each output tile, inside the block."""
    mp, np_, _ = shard.shape
    tm, tn, _ = tiling.tile
    out, r = [], 0
    for rows in steps(mp, tm):
        c = 0
        for cols in steps(np_, tn):
            out.append((r, rows, c, cols))
            c += cols
        r += rows
    return out


def gangs(shards: list, tiling: GemmTiling) -> dict:
    """``{pe: (A gang, B gang)}``: the PEs that can share each operand tile by multicast.

    The A gang of PE ``(a, b, c)`` is every PE ``(a, *, c)`` (the same rows of A and K range),
    the B gang every PE ``(*, b, c)``; a gang shares only if all its members walk the same
    sequence of tiles of that operand (the same number of column tiles for A, of row tiles
    for B), else that entry is None, as it is for a gang of one PE."""
    gm, gn, gk = tiling.grid
    tm, tn, _ = tiling.tile
    by_rank = {s.rank: s for s in shards}
    rows: dict = {}             # (a, c) -> the A gang of grid row a, K range c
    cols: dict = {}             # (b, c) -> the B gang of grid column b, K range c
    out = {}
    for s in shards:
        a, b, c = s.rank // (gn * gk), (s.rank // gk) % gn, s.rank % gk
        if (a, c) not in rows:
            rows[a, c] = _gang([by_rank[(a * gn + j) * gk + c] for j in range(gn)], lambda x: -(-x.shape[1] // tn))
        if (b, c) not in cols:
            cols[b, c] = _gang([by_rank[(i * gn + b) * gk + c] for i in range(gm)], lambda x: -(-x.shape[0] // tm))
        out[s.pe] = (rows[a, c], cols[b, c])
    return out


def _gang(members: list, walk) -> tuple | None:
    if len(members) < 2 or len({walk(x) for x in members}) != 1:
        return None
    return tuple(x.pe for x in members)
