"""GEMM on the simulated PEs: ``C[M,N] = A[M,K] @ B[K,N]`` in f16, bf16, fp32 or fp8
(e4m3, e5m2), C in the input dtype or in ``out_dtype`` (fp8 inputs, bf16 output).

Two independent passes over the same decomposition (``gemm_plan``): the timing pass runs
the tile kernel (``gemm_kernel``) on the simulator; the numeric pass computes C with torch
tile by tile, accumulating each output tile over its K steps in fp32 and summing K-split
partials in PE order, then casting to the output dtype. A timing-only run does no numeric
work and allocates no data. ``tiling=None`` picks the tiling automatically
(``gemm_model.candidates``, best few confirmed by simulation).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import limits
from ..kernel import launch
from ..sim.simulator import RunResult
from .contract import DTYPES, OpFamily, OpRun, Param, as_machine, dtype_of, register, tflops
from .gemm_kernel import gemm_kernel
from .gemm_model import GemmEstimate, candidates, estimate
from .gemm_plan import GemmTiling, check_shape, output_tiles, plan, steps

CONFIRM = 2
CONFIRM_TILES = 4000


def _tiles(m: int, n: int, k: int, tiling: GemmTiling) -> int:
    """Macro-tiles (K steps included) of the whole GEMM: a measure of simulation cost."""
    tm, tn, tk = tiling.tile
    return -(-m // tm) * -(-n // tn) * -(-k // tk)


@dataclass(kw_only=True)
class GemmRun(OpRun):
    """A simulated GEMM: the tiling, the latency and its analytic estimate, and C."""

    m: int
    n: int
    k: int
    tiling: GemmTiling
    composite: bool
    analytic: GemmEstimate
    out_dtype: str = ""
    c: torch.Tensor | None = field(default=None, repr=False)

    @property
    def analytic_pct_peak(self) -> float:
        return 100 * tflops(self.flops, self.analytic.ns) / self.peak_tflops


def simulate(machine, m, n, k, dtype, pes, tiling, composite=True, mode="fast", trace=False,
             out_dtype=None) -> RunResult:
    """The timing pass alone."""
    used = pes[: tiling.grid[0] * tiling.grid[1] * tiling.grid[2]]
    shards = {s.pe: s for s in plan(m, n, k, used, tiling)}
    return launch(gemm_kernel, used, machine, shards, tiling, dtype, composite, out_dtype, mode=mode, trace=trace,
                  name="gemm")


def auto_tiling(machine, m, n, k, dtype, pes, out_dtype=None) -> GemmTiling:
    """The best analytic candidates, confirmed by simulation."""
    ranked = candidates(machine, m, n, k, dtype, pes, out_dtype)
    if not ranked:
        raise ValueError(f"gemm: no tiling of M={m} N={n} K={k} {dtype} fits the TCM of {len(pes)} PEs")
    best = ranked[0][0].ns
    close = [t for e, t in ranked[:CONFIRM] if e.ns <= 1.03 * best]
    if len(close) == 1 or _tiles(m, n, k, close[0]) > CONFIRM_TILES:
        return close[0]
    return min(close, key=lambda t: simulate(machine, m, n, k, dtype, pes, t, out_dtype=out_dtype).latency_ps)


def numeric(a: torch.Tensor, b: torch.Tensor, pes: list, tiling: GemmTiling, out=None) -> torch.Tensor:
    """C (in torch dtype ``out``, default A's) computed with torch on the same decomposition
    as the timing pass."""
    m, k = a.shape
    n = b.shape[1]
    used = pes[: tiling.grid[0] * tiling.grid[1] * tiling.grid[2]]
    blocks: dict = {}
    for s in plan(m, n, k, used, tiling):
        (m0, _), (n0, _), (k0, k1) = s.m, s.n, s.k
        for r, rows, c, cols in output_tiles(s, tiling):
            acc = torch.zeros(rows, cols, dtype=torch.float32)
            kk = k0
            for depth in steps(k1 - k0, tiling.tile[2]):
                acc += a[m0 + r:m0 + r + rows, kk:kk + depth].float() @ b[kk:kk + depth, n0 + c:n0 + c + cols].float()
                kk += depth
            key = (m0 + r, n0 + c)
            blocks[key] = acc if key not in blocks else blocks[key] + acc
    c_out = torch.empty(m, n, dtype=out or a.dtype)
    for (r, c), acc in blocks.items():
        c_out[r:r + acc.shape[0], c:c + acc.shape[1]] = acc.to(c_out.dtype)
    return c_out


def gemm(a=None, b=None, *, shape=None, dtype=None, out_dtype=None, pes=None, tiling=None, composite=True,
         machine=None, mode="fast", trace=False) -> GemmRun:
    """Simulate ``a @ b`` (tensors), or a timing-only GEMM of ``shape=(M, N, K)``, on
    ``machine`` (default: the current one, ``kbtorch.use``); C in ``out_dtype`` (a name or
    torch dtype; default: the input dtype)."""
    machine = as_machine(machine)
    if a is not None:
        if a.dim() != 2 or b is None or b.dim() != 2 or a.shape[1] != b.shape[0]:
            raise ValueError(f"gemm: shapes {tuple(a.shape)} and {tuple(b.shape) if b is not None else None} do not multiply")
        if a.dtype != b.dtype:
            raise ValueError(f"gemm: dtypes {a.dtype} and {b.dtype} differ")
        (m, k), n = a.shape, b.shape[1]
        dtype = dtype_of(a, "gemm").name
    elif shape is not None:
        m, n, k = shape
        dtype = dtype_of(dtype or "f16", "gemm").name
    else:
        raise ValueError("gemm: give tensors a and b, or shape=(M, N, K) for a timing-only run")
    check_shape(m, n, k, dtype)
    out_dtype = dtype_of(out_dtype or dtype, "gemm out_dtype").name
    pes = list(range(len(machine.pes))) if pes is None else list(pes)
    eb, ob = DTYPES[dtype].bytes, DTYPES[out_dtype].bytes
    # NOTE: a lower bound of what the PEs hold: the operands spread evenly over them.
    limits.check_hbm(machine, pes, -(-((m * k + k * n) * eb + m * n * ob) // len(pes)), f"gemm M={m} N={n} K={k} {dtype}")
    tiling = tiling or auto_tiling(machine, m, n, k, dtype, pes, out_dtype)
    limits.check("tiles", _tiles(m, n, k, tiling), f"gemm M={m} N={n} K={k} with {tiling.describe()}")
    need = tiling.grid[0] * tiling.grid[1] * tiling.grid[2]
    if need > len(pes):
        raise ValueError(f"gemm: grid {tiling.grid} needs {need} PEs but the group has {len(pes)}")
    used = pes[:need]
    result = simulate(machine, m, n, k, dtype, pes, tiling, composite, mode, trace, out_dtype)
    c = numeric(a, b, pes, tiling, DTYPES[out_dtype].torch) if a is not None else None
    est = estimate(machine, m, n, k, dtype, pes, tiling, out_dtype)
    return GemmRun(op="gemm", machine=machine, result=result, pes=tuple(used), dtype=dtype, flops=2 * m * n * k,
                   analytic_ps=round(est.ns * 1000), plan=tiling.describe(), m=m, n=n, k=k, tiling=tiling,
                   composite=composite, analytic=est, c=c, out_dtype=out_dtype)


def reference(a: torch.Tensor, b: torch.Tensor, out_dtype=None) -> torch.Tensor:
    """The definition of the numerics: C = A @ B accumulated in fp32, cast to ``out_dtype``
    (default A's dtype)."""
    return (a.float() @ b.float()).to(dtype_of(out_dtype or a.dtype, "gemm out_dtype").torch)


def _timing(machine=None, m=1, n=1, k=1, tile=None, grid=None, **kw) -> GemmRun:
    """The family's timing-only run; ``tile`` and ``grid`` together fix the tiling (neither: automatic)."""
    if (tile is None) != (grid is None):
        raise ValueError("gemm: give tile and grid together (or neither, for the automatic tiling)")
    tiling = GemmTiling(tuple(grid), tuple(tile)) if tile is not None else None
    return gemm(shape=(m, n, k), machine=machine, tiling=tiling, **kw)


register(OpFamily("gemm", _timing,
                  reference, (Param("m", "int", required=True, help="rows of A and C"),
                              Param("n", "int", required=True, help="columns of B and C"),
                              Param("k", "int", required=True, help="columns of A, rows of B"),
                              Param("dtype", "dtype", "f16"),
                              Param("out_dtype", "dtype", help="dtype of C (default: the input dtype)"),
                              Param("pes", "pes"),
                              Param("composite", "flag", True, help="composite commands (off: individual ones)"),
                              Param("tile", "shape", help="macro-tile TM,TN,TK (with grid; default: automatic)"),
                              Param("grid", "shape", help="PE grid GM,GN,GK (with tile; default: automatic)")),
                  help="C[M,N] = A[M,K] @ B[K,N] on the PEs", cli="kbtorch.cli_gemm:add_parser"))
