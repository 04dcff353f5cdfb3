"""GEMM: numerics vs torch.matmul, composite vs chained, K split, tiling, analytic model."""
import pytest
import torch

from kbtorch.runtime import AllocationError
from kbtorch.ops.gemm import gemm
from kbtorch.ops.gemm_model import candidates
from kbtorch.ops.gemm_plan import GemmTiling, plan

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}


def inputs(m, k, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(dtype), torch.randn(k, n, generator=g).to(dtype)


def assert_close(c, a, b):
    ref = (a.float() @ b.float()).to(a.dtype).float()
    scale = ref.abs().max().item()
    assert c.dtype == a.dtype and c.shape == ref.shape
    assert (c.float() - ref).abs().max().item() <= TOL[a.dtype] * scale + 1e-6


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(64, 64, 64), (100, 70, 50), (1, 300, 129), (257, 3, 33)])
def test_numerics_match_torch(ahbm, dtype, shape):
    m, k, n = shape
    a, b = inputs(m, k, n, dtype)
    run = gemm(a, b, pes=range(8), machine=ahbm)
    assert_close(run.c, a, b)
    assert run.latency_ns > 0 and run.result.breakdown()["gemm"] > 0


@pytest.mark.parametrize("tiling", [GemmTiling((2, 2, 2), (32, 48, 16)), GemmTiling((1, 1, 4), (64, 64, 40)),
                                    GemmTiling((4, 2, 1), (17, 64, 64))])
def test_explicit_tilings_with_edge_tiles_and_k_split(ahbm, tiling):
    a, b = inputs(100, 150, 90, torch.float16, seed=1)
    run = gemm(a, b, pes=range(8), tiling=tiling, machine=ahbm)
    assert_close(run.c, a, b)
    assert run.tiling == tiling


def test_composite_and_chained_agree_numerically_and_chained_is_not_faster(ahbm):
    a, b = inputs(256, 1024, 256, torch.float16, seed=2)
    tiling = GemmTiling((1, 1, 1), (256, 256, 128))      # compute-bound: fetch overlaps compute
    comp = gemm(a, b, pes=[0], tiling=tiling, machine=ahbm)
    chain = gemm(a, b, pes=[0], tiling=tiling, composite=False, machine=ahbm)
    assert torch.equal(comp.c, chain.c)
    assert chain.latency_ns > 1.05 * comp.latency_ns


def test_dma_bound_composite_ties_with_chained_commands(ahbm):
    # NOTE: when HBM is the bottleneck both forms stream the same bytes; they tie within 1%.
    tiling = GemmTiling((2, 2, 1), (64, 64, 128))
    comp = gemm(shape=(128, 128, 512), pes=range(4), tiling=tiling, machine=ahbm)
    chain = gemm(shape=(128, 128, 512), pes=range(4), tiling=tiling, composite=False, machine=ahbm)
    assert chain.latency_ns >= 0.99 * comp.latency_ns
    assert chain.result.breakdown()["issue"] > comp.result.breakdown()["issue"]


def test_timing_only_does_no_numeric_work(ahbm):
    run = gemm(shape=(512, 512, 512), dtype="bf16", pes=range(16), machine=ahbm)
    assert run.c is None and run.pct_peak > 10


def test_more_pes_are_never_slower_with_auto_tiling(ahbm):
    times = [gemm(shape=(1024, 1024, 1024), pes=range(p), machine=ahbm).latency_ns for p in (4, 8, 16, 32)]
    assert all(later <= earlier * 1.001 for earlier, later in zip(times, times[1:]))
    assert times[-1] < times[0] / 4


def test_analytic_model_tracks_the_simulation(ahbm):
    for tile in ((128, 128, 256), (256, 256, 512), (64, 128, 1024)):
        run = gemm(shape=(1024, 1024, 2048), pes=range(16), tiling=GemmTiling((4, 4, 1), tile), machine=ahbm)
        assert abs(run.analytic.ns - run.latency_ns) / run.latency_ns < 0.2


def test_candidates_fit_the_tcm_and_oversized_tiles_fail(ahbm):
    ranked = candidates(ahbm, 2048, 2048, 2048, "f16", list(range(16)))
    assert ranked and all(e.ns > 0 for e, _ in ranked)
    with pytest.raises(AllocationError, match="TCM buffer 'staging'"):
        gemm(shape=(2048, 2048, 2048), pes=range(4), tiling=GemmTiling((2, 2, 1), (1024, 1024, 1024)), machine=ahbm)


def test_bad_input_is_named(ahbm):
    a, b = inputs(8, 8, 8, torch.float16)
    with pytest.raises(ValueError, match="do not multiply"):
        gemm(a, b[:4], machine=ahbm)
    with pytest.raises(ValueError, match="dtypes"):
        gemm(a, b.float(), machine=ahbm)
    with pytest.raises(ValueError, match="needs 16 PEs but the group has 8"):
        gemm(a, b, pes=range(8), tiling=GemmTiling((4, 4, 1), (8, 8, 8)), machine=ahbm)
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        gemm(shape=(8, 8, 8), dtype="int8", machine=ahbm)


def test_auto_tiling_simulates_each_confirmed_candidate_once(tiny, monkeypatch):
    import kbtorch.ops.gemm as gemm_mod
    calls = []
    original = gemm_mod.simulate

    def counting(*args, **kw):
        calls.append(args[6])
        return original(*args, **kw)
    monkeypatch.setattr(gemm_mod, "simulate", counting)
    run = gemm(shape=(64, 64, 64), machine=tiny)
    assert len(calls) == len(set(calls)) == 2 and run.tiling in calls       # the winner's run is reused
    calls.clear()
    again = gemm(shape=(64, 64, 64), machine=tiny, mode="coarse")          # another mode: confirmed in it
    assert len(calls) == 2 and again.tiling == run.tiling and again.result.latency_ps != run.result.latency_ps


def test_auto_mode_runs_coarse_above_the_gemms_flit_crossings(tiny, monkeypatch):
    """``mode="auto"`` (the device's GEMMs): coarse above ``COARSE_FLIT_HOPS`` link crossings
    of the kernel's traffic, else fast."""
    from kbtorch.kernel import policy
    tiling = GemmTiling((2, 2, 1), (32, 32, 32))
    fast, coarse = (gemm(shape=(64, 128, 256), tiling=tiling, machine=tiny, mode=m).result.latency_ps
                    for m in ("fast", "coarse"))
    assert fast != coarse
    assert gemm(shape=(64, 128, 256), tiling=tiling, machine=tiny, mode="auto").result.latency_ps == fast
    monkeypatch.setattr(policy, "COARSE_FLIT_HOPS", 0)
    assert gemm(shape=(64, 128, 256), tiling=tiling, machine=tiny, mode="auto").result.latency_ps == coarse


@pytest.mark.parametrize("along", ["n", "k"])
def test_slices_are_independent_per_pe_gemms(tiny, along):
    a, b = inputs(24, 40, 36, torch.float16)
    run = gemm(a, b, machine=tiny, slices=along)
    assert_close(run.c, a, b)                          # a K split's partials sum to C
    assert len(run.pes) == 8 and run.tiling.grid == ((1, 8, 1) if along == "n" else (1, 1, 8))
    assert all(len(s.peers) == 1 for s in plan(24, 36, 40, list(run.pes), run.tiling))
    how = "column-parallel" if along == "n" else "row-parallel"
    assert run.plan.startswith(f"{how} x8, per PE ") and run.latency_ps > 0 and run.analytic_ps > 0
    if along == "n":                                   # the same work as the grid 1x8x1 GEMM
        assert run.latency_ps == gemm(shape=(24, 36, 40), machine=tiny, tiling=run.tiling).latency_ps


def test_slices_and_fit_refuse_what_they_cannot_do(tiny):
    with pytest.raises(ValueError, match="slices='m'"):
        gemm(shape=(8, 8, 8), machine=tiny, slices="m")
    with pytest.raises(ValueError, match="slices or tiling"):
        gemm(shape=(8, 8, 8), machine=tiny, slices="n", tiling=GemmTiling((1, 8, 1), (8, 1, 8)))
    with pytest.raises(ValueError, match="no tiling"):
        gemm(shape=(1, 1, 1), machine=tiny)            # no grid of 8, 4 or 2 PEs fits 1x1x1
    small = gemm(shape=(1, 1, 1), machine=tiny, fit=True)
    assert small.tiling.grid == (1, 1, 1) and small.latency_ps > 0
