"""The GEMM tile kernel: one PE's program for its shard (see ``gemm_plan``).

Per output tile the PE streams its K steps through a composite (DMA_READ A and B tiles ->
FETCH -> GEMM -> STORE -> DMA_WRITE C), or, with ``composite=False``, issues the same work
as individual commands chained by semaphores (reads may run two steps ahead; fetch and
compute share the GEMM engine's queue, so they do not overlap). On a machine with multicast,
``gangs`` (``gemm_plan.gangs``) lets a grid row share its A tiles and a grid column its B
tiles: each tile is read once from HBM by one member and multicast into every member's
staging buffer (the composite's read ``Move`` carries a ``Share``). The engine runs at the peak
of the dtype's rate (``DType.rate``: both fp8 formats at ``fp8``). With a K split, the
non-owners write their fp32 partial tiles into the owner's TCM and ring its IPCQ; the owner
sums them on its MATH engine and writes C.
"""
from __future__ import annotations

from ..kernel.door import Move, Share, Wait
from .contract import DTYPES
from .gemm_plan import Block, GemmTiling, output_tiles, steps
from .layout import ACC_BYTES

BUFFERS = 2


class GemmLayout:
    """Byte offsets inside a shard's blocked A panel, B panel and C block (HBM buffers of
    their own), and the sizes of its TCM regions."""

    def __init__(self, shard: Block, tiling: GemmTiling, dtype: str, out_dtype: str | None = None):
        mp, np_, kp = shard.shape
        tm, tn, tk = tiling.tile
        self.eb, self.kp, self.np_ = DTYPES[dtype].bytes, kp, np_
        self.ob = DTYPES[out_dtype or dtype].bytes       # C's element bytes
        self.hbm = {"a_panel": mp * kp * self.eb, "b_panel": kp * np_ * self.eb, "c_block": mp * np_ * self.ob}
        rows, cols, depth = min(tm, mp), min(tn, np_), min(tk, kp)
        self.read_slot = (rows * depth + depth * cols) * self.eb
        self.write_slot = rows * cols * ACC_BYTES
        self.staging = BUFFERS * (self.read_slot + self.write_slot)
        self.split = len(shard.peers)

    def a(self, r: int, rows: int, k0: int) -> int:
        return (r * self.kp + k0 * rows) * self.eb

    def b(self, c: int, cols: int, k0: int) -> int:
        return (c * self.kp + k0 * cols) * self.eb

    def c(self, r: int, rows: int, c: int) -> int:
        return (r * self.np_ + c * rows) * self.ob


def gemm_kernel(ctx, shards: dict, tiling: GemmTiling, dtype: str, composite: bool,
                out_dtype: str | None = None, gangs: dict | None = None) -> None:
    """Queue PE ``ctx.pe``'s commands for its shard of the GEMM (C in ``out_dtype``, default
    ``dtype``; ``gangs``: ``{pe: (A gang, B gang)}`` of the operand tiles shared by multicast)."""
    shard = shards.get(ctx.pe)
    if shard is None:
        return
    lay = GemmLayout(shard, tiling, dtype, out_dtype)
    mp, np_, _ = shard.shape
    owner = ctx.pe == shard.owner
    for name, nbytes in lay.hbm.items():
        ctx.hbm(name, nbytes)
    ctx.tcm("staging", lay.staging)
    if lay.split > 1 and owner:
        ctx.tcm("partials", (lay.split - 1) * mp * np_ * ACC_BYTES)
        ctx.tcm("result", mp * np_ * ACC_BYTES)
    tiles = output_tiles(shard, tiling)
    issued = 0
    for t, (r, rows, c, cols) in enumerate(tiles):
        last = t == len(tiles) - 1
        if lay.split > 1:
            dst = None if owner else _partial_loc(ctx, shard, lay, t, rows, cols, r, c)
        else:
            dst = ctx.buffer("c_block").loc(lay.c(r, rows, c))
        if composite:
            share = _shares(shard, tiling, (gangs or {}).get(ctx.pe), t)
            _composite_tile(ctx, lay, tiling, dtype, (r, rows, c, cols), dst, "mine" if last else None, share)
        else:
            issued = _chained_tile(ctx, lay, tiling, dtype, (r, rows, c, cols), dst, "mine" if last else None, issued)
    if lay.split > 1:
        _reduce(ctx, shard, lay, dtype, owner)


def _partial_loc(ctx, shard: Block, lay: GemmLayout, t: int, rows: int, cols: int, r: int, c: int):
    peer = shard.peers.index(ctx.pe) - 1
    offset = (peer * lay.np_ * (shard.shape[0]) + r * lay.np_ + c * rows) * ACC_BYTES
    return ctx.remote(shard.owner, "partials").loc(offset)


def _k_groups(kp: int, tk: int) -> list[tuple[int, int, int]]:
    """(k offset, step size, count) runs of equal K steps."""
    out, k0 = [], 0
    for size in steps(kp, tk):
        if out and out[-1][1] == size:
            out[-1] = (out[-1][0], size, out[-1][2] + 1)
        else:
            out.append((k0, size, 1))
        k0 += size
    return out


def _shares(shard: Block, tiling: GemmTiling, gang, t: int):
    """The ``Share`` keys of output tile ``t``'s A and B reads (a function of the K group)."""
    if gang is None:
        return lambda g: (None, None)
    gm, gn, gk = tiling.grid
    a, b, c = shard.rank // (gn * gk), (shard.rank // gk) % gn, shard.rank % gk
    ga, gb = gang
    return lambda g: (ga and Share(f"gemm A {a},{c} t{t} g{g}", ga), gb and Share(f"gemm B {b},{c} t{t} g{g}", gb))


def _composite_tile(ctx, lay: GemmLayout, tiling, dtype, tile, dst, signal, share) -> None:
    r, rows, c, cols = tile
    groups = _k_groups(lay.kp, tiling.tile[2])
    staging, a, b = (ctx.buffer(n) for n in ("staging", "a_panel", "b_panel"))
    for g, (k0, depth, count) in enumerate(groups):
        final = g == len(groups) - 1
        a_bytes, b_bytes = rows * depth * lay.eb, depth * cols * lay.eb
        out_bytes = rows * cols * (ACC_BYTES if dst is None or lay.split > 1 else lay.ob)
        writes = (Move(dst, out_bytes),) if final and dst is not None else ()
        sa, sb = share(g)
        ctx.composite(tiles=count, staging=staging.loc(), buffers=BUFFERS, accumulate=count, dtype=DTYPES[dtype].rate,
                      reads=(Move(a.loc(lay.a(r, rows, k0)), a_bytes, a_bytes, share=sa),
                             Move(b.loc(lay.b(c, cols, k0)), b_bytes, b_bytes, share=sb)),
                      fetch_bytes=a_bytes + b_bytes, flops=2 * rows * cols * depth,
                      store_bytes=rows * cols * ACC_BYTES if final else 0, writes=writes,
                      signal=(signal,) if final and signal else (), label=f"gemm tile {r},{c} k{k0}")


def _chained_tile(ctx, lay: GemmLayout, tiling, dtype, tile, dst, signal, issued: int) -> int:
    """Queue one output tile as individual commands; ``issued`` counts K steps so far on this
    PE (reads of step s >= 2 wait until the fetch of step s - 2 has freed its buffer)."""
    r, rows, c, cols = tile
    staging, a, b = (ctx.buffer(n) for n in ("staging", "a_panel", "b_panel"))
    for k0, depth, count in _k_groups(lay.kp, tiling.tile[2]):
        a_bytes, b_bytes = rows * depth * lay.eb, depth * cols * lay.eb
        for s in range(count):
            kk = k0 + s * depth
            slot = (issued % BUFFERS) * lay.read_slot
            free = ("free",) if issued >= BUFFERS else ()
            ctx.dma_read(a.loc(lay.a(r, rows, kk)), staging.loc(slot), a_bytes, wait=free, signal="a")
            ctx.dma_read(b.loc(lay.b(c, cols, kk)), staging.loc(slot + a_bytes), b_bytes, signal="b")
            ctx.fetch(a_bytes + b_bytes, wait=("a", "b"), signal="free")
            ctx.gemm(rows, cols, depth, DTYPES[dtype].rate)
            issued += 1
    out_bytes = rows * cols * (ACC_BYTES if lay.split > 1 else lay.ob)
    done = (signal,) if signal else ()
    if dst is None:
        ctx.store(rows * cols * ACC_BYTES, signal=done)
        return issued
    ctx.store(rows * cols * ACC_BYTES, signal="stored")
    ctx.dma_write(staging.loc(), dst, out_bytes, wait="stored", signal=done)
    return issued


def _reduce(ctx, shard: Block, lay: GemmLayout, dtype: str, owner: bool) -> None:
    mp, np_, _ = shard.shape
    if not owner:
        ctx.send(shard.owner, "partial", wait="mine", label="partial ready")
        return
    ctx.math("add", (lay.split - 1) * mp * np_, "fp32", wait=(Wait("partial", lay.split - 1), Wait("mine")),
             signal="summed", label="sum K-split partials")
    ctx.dma_write(ctx.buffer("result").loc(), ctx.buffer("c_block").loc(), mp * np_ * lay.ob, wait="summed",
                  label="write C")
