"""Vector tile kernel: ``out = op(x[, y])`` over N elements on the MATH engines.

Each PE of the group takes an equal contiguous slice (the last ones may be one element
shorter) and streams it through one composite: DMA_READ its inputs' tiles from its HBM
-> FETCH -> MATH -> STORE -> DMA_WRITE the output tile to its HBM. Inputs and output are
HBM buffers of the PE (``ctx.hbm``); tiles are at most ``TILE_BYTES`` of one
input. Row reductions and normalisations use the same pass: ``flops_per_element`` sets the
MATH work, ``out_ratio`` the output elements per input element (1/D for a reduction over
rows of D). Timing only: the numbers come from torch in the caller.
"""
from __future__ import annotations

from functools import partial

from .. import limits
from ..kernel import build, run_programs
from ..kernel.door import Move
from .contract import DTYPES, OpFamily, OpRun, Param, Sample, as_machine, check_pes, dtype_of, register, sim_mode
from .layout import page_align

TILE_BYTES = 256 * 1024         # NOTE: the kernel's tile size (a tiling choice, not hardware)
BUFFERS = 2


def share(n: int, parts: int, rank: int) -> int:
    """Elements of ``rank``'s contiguous slice when ``n`` are split into ``parts``: equal,
    the first ``n % parts`` one element longer."""
    base, extra = divmod(n, parts)
    return base + (rank < extra)


def elementwise_kernel(ctx, op: str, n: int, inputs: int, elem_bytes: int, dtype: str, flops: int,
                       out_ratio: float) -> None:
    """Queue PE ``ctx.pe``'s share of a vector op over ``n`` elements."""
    size = share(n, len(ctx.group), ctx.rank)
    if size == 0:
        return
    tile = max(1, min(size, TILE_BYTES // elem_bytes))
    tiles = -(-size // tile)
    tb = tile * elem_bytes
    ob = max(elem_bytes, round(tb * out_ratio) // elem_bytes * elem_bytes)
    span = page_align(ctx.machine, size * elem_bytes)
    ins = [ctx.hbm(f"in{i}", span) for i in range(inputs)]
    out = ctx.hbm("out", tiles * ob)
    staging = ctx.tcm("staging", BUFFERS * (inputs * tb + ob))
    reads = tuple(Move(buf.loc(), tb, tb) for buf in ins)
    # NOTE: a copy (no MATH work) only stages tiles through TCM: DMA_READ -> DMA_WRITE.
    engine = dict(fetch_bytes=inputs * tb, flops=flops * tile, store_bytes=ob) if flops else {}
    ctx.composite(tiles=tiles, staging=staging.loc(), engine="math", dtype=dtype, reads=reads,
                  writes=(Move(out.loc(), ob, ob),), buffers=BUFFERS, label=f"{op} x{tiles}", **engine)


def elementwise(op: str, n: int, *, inputs: int = 2, dtype: str = "f16", elem_bytes: int | None = None, pes=None,
                machine=None, mode: str = "fast", flops_per_element: int | None = None,
                out_ratio: float = 1.0, trace: bool = False) -> OpRun:
    """Simulate ``op`` over ``n`` elements with ``inputs`` operands; its MATH cost per element
    is the machine's (``flops_per_element`` of the math engine) unless given. ``mode="auto"``:
    see ``pass_mode``."""
    machine = as_machine(machine)
    group, flops, eb = checked(machine, op, n, inputs, dtype, elem_bytes, pes, flops_per_element)
    programs = build(elementwise_kernel, group, machine, op, n, inputs, eb, dtype, flops, out_ratio, name=op)
    result = run_programs(programs, machine, mode=pass_mode(mode, machine), trace=trace)
    analytic, bound = estimate(machine, group, n, inputs, eb, dtype, flops, out_ratio)
    return OpRun(op=f"elementwise {op}", machine=machine, result=result, pes=tuple(group), dtype=dtype,
                 flops=flops * n, analytic_ps=analytic, bound_ps=bound, plan=f"{len(group)} PEs, {inputs} input(s)")


def pass_mode(mode: str, machine):
    """The simulation mode of a pass: ``mode`` as given, or under ``mode="auto"`` a function
    of the programs the simulation runs (one unit per class of symmetric units,
    ``kernel.run_programs``) giving their ``kernel.policy.sim_mode``.

    NOTE: a pass's coarse run streams whole tiles: equal to fast on maia200 (a replicated
    RMSNorm over 288 PEs of maia200_x8, 346.187 us both, 1.76 M events -> 46 k), a constant
    ~1 us shorter on AHBM (its first tile's fill: -0.44% on a 1.9 G-element pass, -4.9% on
    a 116 M-element one). Counting the reduced programs' traffic keeps fast the passes
    whose fast run is already cheap (AHBM's 32 CUBEs are one class: that 116 M pass is 2 M
    link crossings, not 16 M) and so short that the fill matters."""
    return partial(sim_mode, mode, machine) if mode == "auto" else mode


def checked(machine, op: str, n: int, inputs: int, dtype: str, elem_bytes, pes, flops_per_element) -> tuple:
    """The checks before any work -> (the PEs used, MATH flops per element, element bytes):
    sizes, the op's cost on the machine, PEs and HBM capacity."""
    for name, x in (("elements", n), ("inputs", inputs)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ValueError(f"elementwise {op}: {name}={x!r} must be a positive int")
    group = check_pes(machine, pes, f"elementwise {op}")
    group = group[:min(len(group), n)]
    flops = machine.math_flops(op, group[0]) if flops_per_element is None else flops_per_element
    eb = dtype_of(dtype, f"elementwise {op}").bytes if elem_bytes is None else elem_bytes
    # NOTE: inputs and output, each split evenly over the PEs used.
    limits.check_hbm(machine, group, (inputs + 1) * -(-n // len(group)) * eb, f"elementwise {op} of {n} elements")
    return group, flops, eb


def estimate(machine, group: list, n: int, inputs: int, eb: int, dtype: str, flops: int,
             out_ratio: float) -> tuple[int, int]:
    """(estimate, bound) in ps. Bound: the slowest PE's bytes at its share of the HBM
    bandwidth or through its DMA ports, or its MATH work at its peak (``dtype``'s rate, fp32
    for types the engine has no peak for). Estimate: that, plus the issue of its composite,
    one tile through the other stages and a read's round trip either end."""
    size, pe = -(-n // len(group)), group[0]
    read, write = size * eb * inputs, size * eb * out_ratio
    hbm = min(machine.hbm_gbps([pe]), machine.hbm_gbps(group) / len(group))
    rates = machine.dtypes("math", pe)
    rate = machine.engine_tflops(pe, "math", DTYPES[dtype].rate if DTYPES[dtype].rate in rates else "fp32")
    stages = {"hbm": (read + write) / hbm, "read port": read / machine.port_gbps(pe, "dma_rd"),
              "write port": write / machine.port_gbps(pe, "dma_wr"), "math": flops * size / rate / 1000}
    bound = max(stages.values())
    tiles = -(-size * eb // TILE_BYTES)
    issue = machine.issue.kind_ps("composite", moves=inputs + 1, stages=3 if flops else 0) / 1000
    fill = sum(v for v in stages.values() if v < bound) / tiles + 2 * machine.read_trip_ns(pe)
    return round((bound + issue + fill) * 1000), round(bound * 1000)


def reference(op: str, *inputs):
    """The definition of the numerics: the torch function of that name."""
    import torch
    return (getattr(torch, op, None) or getattr(torch.nn.functional, op))(*inputs)


def _check(machine=None, op="add", n=1 << 20, inputs=2, dtype="f16", pes=None, **_) -> None:
    """The timing-only run's checks before any work."""
    checked(as_machine(machine), op, n, inputs, dtype, None, pes, None)


# NOTE: tolerance: the estimate against the simulation of the samples: tiny within 20%,
# diewide -46% (exp over 3 PEs: the queueing at the one die-wide memory is not in it). No
# numeric: timing only, the caller (the "ahbm" device) computes the numbers with torch.
register(OpFamily("vector", lambda machine=None, op="add", n=1 << 20, **kw: elementwise(op, n, machine=machine, **kw),
                  reference, (Param("op", "str", "add", "math op (the topology's flops_per_element names)"),
                         Param("n", "int", required=True, help="elements"), Param("inputs", "int", 2, "operands"),
                         Param("dtype", "dtype", "f16"), Param("pes", "pes")),
                  help="elementwise vector op on the MATH engines",
                  samples=(Sample(dict(op="add", n=262144)), Sample(dict(op="gelu", n=100000, inputs=1, dtype="fp32")),
                           Sample(dict(op="exp", n=262144, inputs=1, pes=[0, 1, 2]))),
                  bad=(Sample(dict(op="nope", n=8), "op 'nope'"), Sample(dict(op="add", n=8, inputs=0), "inputs"),
                       Sample(dict(op="add", n=8, pes=[99]), "pes"), Sample(dict(op="add", n=8, dtype="x"), "dtype")),
                  tolerance=0.5, check=_check))
