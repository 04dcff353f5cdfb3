"""GEMM on the simulated PEs: ``C[M,N] = A[M,K] @ B[K,N]`` in f16, bf16 or fp32.

Two independent passes over the same decomposition (``gemm_plan``): the timing pass runs
the tile kernel (``gemm_kernel``) on the simulator; the numeric pass computes C with torch
tile by tile, accumulating each output tile over its K steps in fp32 and summing K-split
partials in PE order, then casting to the input dtype. A timing-only run does no numeric
work and allocates no data. ``tiling=None`` picks the tiling automatically
(``gemm_model.candidates``, best few confirmed by simulation).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..kernel import launch
from ..sim.simulator import RunResult
from ..topology import load_machine
from .gemm_kernel import gemm_kernel
from .gemm_model import GemmEstimate, candidates, estimate
from .gemm_plan import GemmTiling, check_shape, output_tiles, plan, steps

TORCH_DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
CONFIRM = 2
CONFIRM_TILES = 4000


def _tiles(m: int, n: int, k: int, tiling: GemmTiling) -> int:
    """Macro-tiles (K steps included) of the whole GEMM: a measure of simulation cost."""
    tm, tn, tk = tiling.tile
    return -(-m // tm) * -(-n // tn) * -(-k // tk)


@dataclass
class GemmRun:
    """A simulated GEMM: the tiling, the latency and its analytic estimate, and C."""

    m: int
    n: int
    k: int
    dtype: str
    pes: list
    tiling: GemmTiling
    composite: bool
    result: RunResult
    analytic: GemmEstimate
    peak_tflops: float
    hbm_gbps_peak: float
    c: torch.Tensor | None = field(default=None, repr=False)

    @property
    def latency_ns(self) -> float:
        return self.result.latency_ns

    @property
    def tflops(self) -> float:
        return 2 * self.m * self.n * self.k / self.latency_ns / 1000

    @property
    def pct_peak(self) -> float:
        return 100 * self.tflops / self.peak_tflops

    @property
    def analytic_pct_peak(self) -> float:
        return 100 * 2 * self.m * self.n * self.k / self.analytic.ns / 1000 / self.peak_tflops

    @property
    def hbm_bytes(self) -> int:
        return sum(s["bursts"] for s in self.result.stats["memories"].values()) * 256

    @property
    def hbm_gbps(self) -> float:
        return self.hbm_bytes / self.latency_ns

    @property
    def pct_hbm(self) -> float:
        return 100 * self.hbm_gbps / self.hbm_gbps_peak


def _peaks(machine, pes: list, dtype: str) -> tuple[float, float]:
    """(f16-or-dtype TFLOP/s, HBM GB/s) peaks of the PEs used."""
    g = machine.graph
    tflops = sum(g.nodes[machine.pes[p].node("gemm")]["params"]["tflops"][dtype] for p in pes)
    return tflops, machine.hbm_gbps(pes)


def simulate(machine, m, n, k, dtype, pes, tiling, composite=True, mode="fast", trace=False) -> RunResult:
    """The timing pass alone."""
    used = pes[: tiling.grid[0] * tiling.grid[1] * tiling.grid[2]]
    shards = {s.pe: s for s in plan(m, n, k, used, tiling)}
    return launch(gemm_kernel, used, machine, shards, tiling, dtype, composite, mode=mode, trace=trace, name="gemm")


def auto_tiling(machine, m, n, k, dtype, pes) -> GemmTiling:
    """The best analytic candidates, confirmed by simulation."""
    ranked = candidates(machine, m, n, k, dtype, pes)
    if not ranked:
        raise ValueError(f"gemm: no tiling of M={m} N={n} K={k} {dtype} fits the TCM of {len(pes)} PEs")
    best = ranked[0][0].ns
    close = [t for e, t in ranked[:CONFIRM] if e.ns <= 1.03 * best]
    if len(close) == 1 or _tiles(m, n, k, close[0]) > CONFIRM_TILES:
        return close[0]
    return min(close, key=lambda t: simulate(machine, m, n, k, dtype, pes, t).latency_ps)


def numeric(a: torch.Tensor, b: torch.Tensor, pes: list, tiling: GemmTiling) -> torch.Tensor:
    """C computed with torch on the same decomposition as the timing pass."""
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
    out = torch.empty(m, n, dtype=a.dtype)
    for (r, c), acc in blocks.items():
        out[r:r + acc.shape[0], c:c + acc.shape[1]] = acc.to(a.dtype)
    return out


def gemm(a=None, b=None, *, shape=None, dtype=None, pes=None, tiling=None, composite=True,
         machine="ahbm", mode="fast", trace=False) -> GemmRun:
    """Simulate ``a @ b`` (tensors), or a timing-only GEMM of ``shape=(M, N, K)``."""
    machine = load_machine(machine) if isinstance(machine, str) else machine
    if a is not None:
        if a.dim() != 2 or b is None or b.dim() != 2 or a.shape[1] != b.shape[0]:
            raise ValueError(f"gemm: shapes {tuple(a.shape)} and {tuple(b.shape) if b is not None else None} do not multiply")
        if a.dtype != b.dtype or a.dtype not in TORCH_DTYPES.values():
            raise ValueError(f"gemm: dtypes {a.dtype} and {b.dtype}: need two of {', '.join(map(str, TORCH_DTYPES.values()))}")
        (m, k), n = a.shape, b.shape[1]
        dtype = next(name for name, t in TORCH_DTYPES.items() if t == a.dtype)
    elif shape is not None:
        m, n, k = shape
        dtype = dtype or "f16"
    else:
        raise ValueError("gemm: give tensors a and b, or shape=(M, N, K) for a timing-only run")
    check_shape(m, n, k, dtype)
    pes = list(range(len(machine.pes))) if pes is None else list(pes)
    tiling = tiling or auto_tiling(machine, m, n, k, dtype, pes)
    need = tiling.grid[0] * tiling.grid[1] * tiling.grid[2]
    if need > len(pes):
        raise ValueError(f"gemm: grid {tiling.grid} needs {need} PEs but the group has {len(pes)}")
    used = pes[:need]
    result = simulate(machine, m, n, k, dtype, pes, tiling, composite, mode, trace)
    c = numeric(a, b, pes, tiling) if a is not None else None
    tflops, hbm = _peaks(machine, used, dtype)
    return GemmRun(m, n, k, dtype, used, tiling, composite, result,
                   estimate(machine, m, n, k, dtype, pes, tiling), tflops, hbm, c)
