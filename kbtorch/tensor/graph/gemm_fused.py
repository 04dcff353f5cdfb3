"""The GEMM kernel's fused work in graph mode (``fusion`` rules 2 and 3): a norm prologue
on each PE's MATH engine beside its GEMM commands, and an epilogue applying a vector
chain's MATH to each PE's part of the result after its last GEMM command."""
from __future__ import annotations

from dataclasses import replace

from ...kernel.api import contexts
from ...ops.vector import TILE_BYTES
from ...kernel.door import Compute, Move, Signal, Wait


def prologue(programs: dict, vecs: list) -> dict:
    """``programs`` with each PE's norm statistics and row scaling on its MATH engine, beside
    its GEMM commands (the norm's MATH work over the rows it holds; launched with them)."""
    per = sum(-(-v.n // len(v.pes)) * v.flops for v in vecs)
    return {pe: [Compute(per, engine="math", dtype=vecs[-1].dtype, label="norm prologue")] + list(cmds) if cmds
            else cmds for pe, cmds in programs.items()}


def epilogue(machine, gemm, vec, n: int, inputs: int, eb: int, flops: int, ratio: float) -> dict:
    """The GEMM's programs, each PE then applying the epilogue's MATH to its part of the
    result (after its last GEMM command), reading ``inputs`` more operands and writing
    ``ratio`` x n more elements."""
    progs = gemm.result.programs or {}
    pes = [pe for pe in sorted(progs) if progs[pe]]
    per = -(-n // len(vec.pes)) if len(vec.pes) else n
    ctxs = {c.pe: c for c in contexts(machine, pes, "epilogue")}
    out = {}
    for pe in pes:
        cmds = list(progs[pe])
        last = max(i for i, c in enumerate(cmds) if c.engine == "gemm") if any(c.engine == "gemm" for c in cmds) \
            else len(cmds) - 1
        c = cmds[last]
        if len(c.signals) < 2:
            cmds[last] = replace(c, signals=c.signals + (Signal("epilogue"),))
            wait = (Wait("epilogue"),)
        else:
            wait = ()
        ctx = ctxs[pe]
        tile = max(1, min(per, TILE_BYTES // eb))
        tiles, tb = -(-per // tile), tile * eb
        ob = max(eb, round(tb * ratio) // eb * eb) if ratio else 0
        reads = tuple(Move(ctx.hbm(f"in{i}", tiles * tb).loc(), tb, tb) for i in range(inputs))
        writes = (Move(ctx.hbm("out", tiles * ob).loc(), ob, ob),) if ob else ()
        staging = ctx.tcm("staging", 2 * ((inputs + 1) * tb + max(ob, tb)))
        ctx.composite(tiles=tiles, staging=staging.loc(), engine="math", dtype=vec.dtype, reads=reads,
                      writes=writes, fetch_bytes=(inputs + 1) * tb, flops=flops * tile, store_bytes=max(ob, tb),
                      wait=wait, label=f"epilogue x{tiles}")
        out[pe] = cmds + ctx.commands
    return out
