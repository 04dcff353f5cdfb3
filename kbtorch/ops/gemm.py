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
from ..kernel import build, run_programs
from ..kernel.door import RunResult
from .contract import (DTYPES, OpFamily, OpRun, Param, Sample, as_machine, check_pes, dtype_of, register, sim_mode,
                       tflops)
from .gemm_kernel import gemm_kernel
from .gemm_model import NEAR, GemmEstimate, candidates, estimate, fit_counts, multicast_gangs
from .gemm_plan import GemmTiling, check_shape, output_tiles, plan, split, steps

# NOTE: how much simulation the automatic tiling spends confirming (not hardware).
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
    """The timing pass alone (``mode="auto"``: coarse or fast by the built programs' link
    load, ``kernel.policy.sim_mode``)."""
    used = pes[: tiling.grid[0] * tiling.grid[1] * tiling.grid[2]]
    blocks = plan(m, n, k, used, tiling)
    gangs = multicast_gangs(machine, blocks, tiling) if composite else {}
    programs = build(gemm_kernel, used, machine, {s.pe: s for s in blocks}, tiling, dtype, composite, out_dtype, gangs,
                     name="gemm")
    return run_programs(programs, machine, mode=sim_mode(mode, machine, programs), trace=trace)


def auto_tiling(machine, m, n, k, dtype, pes, out_dtype=None, mode="fast") -> tuple[GemmTiling, RunResult | None]:
    """The best analytic candidates, confirmed by simulation: -> (tiling, its confirming run
    (composite, in ``mode``, no trace), None when there was no need to confirm)."""
    ranked = candidates(machine, m, n, k, dtype, pes, out_dtype)
    if not ranked:
        raise ValueError(f"gemm: no tiling of M={m} N={n} K={k} {dtype} fits the TCM of {len(pes)} PEs")
    best = ranked[0][0].ns
    close = [t for e, t in ranked[:CONFIRM] if e.ns <= NEAR * best]
    if len(close) == 1 or _tiles(m, n, k, close[0]) > CONFIRM_TILES:
        return close[0], None
    runs = [(simulate(machine, m, n, k, dtype, pes, t, mode=mode, out_dtype=out_dtype), t) for t in close]
    result, tiling = min(runs, key=lambda rt: rt[0].latency_ps)
    return tiling, result


def slice_tiling(machine, m, n, k, dtype, pes, along: str, out_dtype=None) -> GemmTiling:
    """The tiling of independent slices: each of the first ``min(len(pes), n or k)`` PEs
    multiplies its own slice of the operands along N (``along="n"``: a column-parallel
    layer) or K (``"k"``: row-parallel, each PE's partial C left on it), with the macro-tile
    the analytic model ranks first for the widest slice on one PE.

    NOTE: no confirming simulation: it would run the whole group per candidate."""
    if along not in ("n", "k"):
        raise ValueError(f"gemm: slices='{along}' is not one of 'n', 'k'")
    p = min(len(pes), n if along == "n" else k)
    widest = split(n if along == "n" else k, p, 0)[1]
    shape = (m, widest, k) if along == "n" else (m, n, widest)
    ranked = candidates(machine, *shape, dtype, pes[:1], out_dtype)
    if not ranked:
        raise ValueError(f"gemm: no tiling of a {'x'.join(map(str, shape))} {dtype} slice fits the TCM of PE {pes[0]}")
    grid = (1, p, 1) if along == "n" else (1, 1, p)
    return GemmTiling(grid, ranked[0][1].tile, partial=along == "k")


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
         machine=None, mode="fast", trace=False, slices=None, fit=False) -> GemmRun:
    """Simulate ``a @ b`` (tensors), or a timing-only GEMM of ``shape=(M, N, K)``, on
    ``machine`` (default: the current one, ``kbtorch.use``); C in ``out_dtype`` (a name or
    torch dtype; default: the input dtype). ``slices="n"`` or ``"k"``: every PE multiplies
    its own slice of the operands (``slice_tiling``); ``fit``: when no tiling fits the
    group, the most of its PEs that the shape can use (``fit_counts``)."""
    machine = as_machine(machine)
    pes = list(range(len(machine.pes))) if pes is None else list(pes)
    if fit and tiling is None:
        for count in fit_counts(len(pes)):
            try:
                return gemm(a, b, shape=shape, dtype=dtype, out_dtype=out_dtype, pes=pes[:count], composite=composite,
                            machine=machine, mode=mode, trace=trace, slices=slices)
            except ValueError as exc:
                error = exc
        raise error
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
    pes, out_dtype = checked(machine, m, n, k, dtype, out_dtype, pes, tiling)
    result = None
    if slices is not None:
        if tiling is not None:
            raise ValueError("gemm: give slices or tiling, not both")
        tiling = slice_tiling(machine, m, n, k, dtype, pes, slices, out_dtype)
    elif tiling is None:
        tiling, result = auto_tiling(machine, m, n, k, dtype, pes, out_dtype, mode)
    limits.check("tiles", _tiles(m, n, k, tiling), f"gemm M={m} N={n} K={k} with {tiling.describe()}")
    need = tiling.grid[0] * tiling.grid[1] * tiling.grid[2]
    if need > len(pes):
        raise ValueError(f"gemm: grid {tiling.grid} needs {need} PEs but the group has {len(pes)}")
    used = pes[:need]
    if result is None or not composite or trace:
        result = simulate(machine, m, n, k, dtype, pes, tiling, composite, mode, trace, out_dtype)
    c = numeric(a, b, pes, tiling, DTYPES[out_dtype].torch) if a is not None else None
    est = estimate(machine, m, n, k, dtype, pes, tiling, out_dtype)
    # NOTE: the bound: the slowest PE's own GEMM work at its engine's peak (the simulation rounds up).
    return GemmRun(op="gemm", machine=machine, result=result, pes=tuple(used), dtype=dtype, flops=2 * m * n * k,
                   analytic_ps=round(est.ns * 1000), bound_ps=int(est.compute_ns * 1000),
                   plan=_describe(m, n, k, tiling, slices), m=m, n=n, k=k, tiling=tiling, composite=composite,
                   analytic=est, c=c, out_dtype=out_dtype)


def checked(machine, m, n, k, dtype, out_dtype, pes, tiling) -> tuple[list, str]:
    """The checks before any work -> (PEs, output dtype): shape, dtypes, PEs, HBM capacity
    and, with a given tiling, its grid and tile count."""
    check_shape(m, n, k, dtype)
    out_dtype = dtype_of(out_dtype or dtype, "gemm out_dtype").name
    pes = check_pes(machine, pes, "gemm")
    eb, ob = DTYPES[dtype].bytes, DTYPES[out_dtype].bytes
    # NOTE: a lower bound of what the PEs hold: the operands spread evenly over them.
    need = -(-((m * k + k * n) * eb + m * n * ob) // len(pes))
    limits.check_hbm(machine, pes, need, f"gemm M={m} N={n} K={k} {dtype}")
    if tiling is not None:
        check_tiling(m, n, k, tiling, pes)
    return pes, out_dtype


def check_tiling(m, n, k, tiling: GemmTiling, pes: list) -> None:
    """ValueError unless grid and tile are three positive ints each, the grid fits the PEs
    and the problem, and the tiles stay within the limit."""
    for name, xs in (("grid", tiling.grid), ("tile", tiling.tile)):
        if len(xs) != 3 or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in xs):
            raise ValueError(f"gemm: {name} {list(xs)} must be three positive ints ({name[0].upper()}M, "
                             f"{name[0].upper()}N, {name[0].upper()}K)")
    need = tiling.grid[0] * tiling.grid[1] * tiling.grid[2]
    if need > len(pes):
        raise ValueError(f"gemm: grid {tiling.grid} needs {need} PEs but the group has {len(pes)}")
    if any(g > x for g, x in zip(tiling.grid, (m, n, k))):
        raise ValueError(f"gemm: grid {tiling.grid} is larger than the problem M={m} N={n} K={k}")
    limits.check("tiles", _tiles(m, n, k, tiling), f"gemm M={m} N={n} K={k} with {tiling.describe()}")


def _describe(m: int, n: int, k: int, tiling: GemmTiling, slices: str | None) -> str:
    """The plan's text; for slices, the layer's parallelism and the widest slice per PE."""
    if slices is None:
        return tiling.describe()
    p = tiling.grid[1] * tiling.grid[2]
    shape = (m, split(n, p, 0)[1], k) if slices == "n" else (m, n, split(k, p, 0)[1])
    how = "column-parallel" if slices == "n" else "row-parallel"
    return f"{how} x{p}, per PE {'x'.join(map(str, shape))}, tile {'x'.join(map(str, tiling.tile))}"


def reference(a: torch.Tensor, b: torch.Tensor, out_dtype=None) -> torch.Tensor:
    """The definition of the numerics: C = A @ B accumulated in fp32, cast to ``out_dtype``
    (default A's dtype)."""
    return (a.float() @ b.float()).to(dtype_of(out_dtype or a.dtype, "gemm out_dtype").torch)


def _tiling(tile, grid) -> GemmTiling | None:
    """``tile`` and ``grid`` together fix the tiling (neither: automatic)."""
    if (tile is None) != (grid is None):
        raise ValueError("gemm: give tile and grid together (or neither, for the automatic tiling)")
    return GemmTiling(tuple(grid), tuple(tile)) if tile is not None else None


def _check(machine=None, m=1, n=1, k=1, tile=None, grid=None, dtype="f16", out_dtype=None, pes=None, **_) -> None:
    """The timing-only run's checks before any work (``_``: params that need none)."""
    checked(as_machine(machine), m, n, k, dtype_of(dtype, "gemm").name, out_dtype, pes, _tiling(tile, grid))


def _timing(machine=None, m=1, n=1, k=1, tile=None, grid=None, **kw) -> GemmRun:
    """The family's timing-only run."""
    return gemm(shape=(m, n, k), machine=machine, tiling=_tiling(tile, grid), **kw)


def _numeric(machine=None, m=1, n=1, k=1, dtype="f16", out_dtype=None, tile=None, grid=None, **kw) -> tuple:
    """(run, C, reference): the family on seeded random A and B."""
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(*size, generator=g).to(DTYPES[dtype].torch) for size in ((m, k), (k, n)))
    run = gemm(a, b, machine=machine, out_dtype=out_dtype, tiling=_tiling(tile, grid), **kw)
    return run, run.c, reference(a, b, out_dtype)


# NOTE: tolerance: the ideal-pipeline estimate against the simulation of the samples: tiny
# within 14% (the K-split's partial sums), diewide -47%: its tiles queue at the one die-wide
# memory's ports and channels (hbm_port + hbm: 575 of 1244 ns), which the estimate does not
# model; the Qwen projections on AHBM are within 20% (tests/test_gemm.py). atol: C summed in
# fp32 in another order (K split over PEs), then rounded to its dtype: within one ulp.
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
                  help="C[M,N] = A[M,K] @ B[K,N] on the PEs",
                  samples=(Sample(dict(m=128, n=128, k=256)),
                           Sample(dict(m=64, n=256, k=1024, dtype="bf16", out_dtype="fp32", grid=(1, 2, 4),
                                       tile=(64, 128, 256)))),
                  bad=(Sample(dict(m=0, n=8, k=8), "m"), Sample(dict(m=8, n=8, k=8, dtype="f17"), "dtype"),
                       Sample(dict(m=8, n=8, k=8, pes=[99]), "pes"),
                       Sample(dict(m=8, n=8, k=8, tile=(8, 8, 8)), "grid"),
                       Sample(dict(m=64, n=64, k=64, grid=(4, 4, 4), tile=(16, 16, 16)), "grid")),
                  tolerance=0.5, numeric=_numeric, atol=1e-2, check=_check))
