"""The tile-kernel API: SPMD launch, buffers with memory levels, semaphores, errors."""
import pytest

from kbtorch.kernel import build, launch
from kbtorch.runtime import AllocationError
from kbtorch.sim.simulator import SimulationStuck


def ring_kernel(ctx, nbytes):
    """Each PE sends a block from its HBM to the next PE's TCM, then signals it."""
    buf = ctx.tcm("inbox", nbytes)
    nxt = ctx.group[(ctx.rank + 1) % len(ctx.group)]
    dst = ctx.machine.pes[nxt].node("tcm")
    from kbtorch.sim.commands import Loc
    ctx.dma_read(Loc(ctx.hbm_node, 0), Loc(dst, buf.addr), nbytes, signal="sent")
    ctx.send(nxt, "got", wait="sent")
    ctx.math("add", nbytes // 2, wait="got", label="consume")


def test_spmd_launch_knows_pe_rank_and_group(ahbm):
    seen = []
    build(lambda ctx: seen.append((ctx.pe, ctx.rank, ctx.group)), [5, 9, 2], ahbm)
    assert seen == [(5, 0, (5, 9, 2)), (9, 1, (5, 9, 2)), (2, 2, (5, 9, 2))]


def test_ring_kernel_runs_and_reports_ipcq(ahbm):
    result = launch(ring_kernel, [0, 8, 16, 24], ahbm, 1 << 16)
    assert set(result.pe_finish_ps) == {0, 8, 16, 24}
    assert result.stats["engines"]["ipcq"]["commands"] == 4
    assert result.stats["engines"]["math"]["commands"] == 4


def test_buffers_name_their_level(ahbm):
    programs = build(lambda ctx: ctx.tcm("x", 1000), [3], ahbm)
    assert programs == {3: []}
    ctx_bufs = []
    build(lambda ctx: ctx_bufs.append(ctx.tcm("x", 1000)), [3], ahbm)
    assert ctx_bufs[0].level == "tcm" and ctx_bufs[0].node == ahbm.pes[3].node("tcm")


def test_tcm_over_allocation_names_the_buffer(ahbm):
    def greedy(ctx):
        ctx.tcm("weights", 10 << 20)
        ctx.tcm("activations", 6 << 20)
    with pytest.raises(AllocationError, match="kernel 'greedy' PE 0: TCM buffer 'activations' of 6.00 MiB does not fit"):
        build(greedy, [0], ahbm)


def test_waiting_on_a_semaphore_nobody_signals_is_reported(ahbm):
    def stuck(ctx):
        ctx.gemm(128, 128, 128, wait="never", label="gemm tile 0")
    with pytest.raises(SimulationStuck, match="PE 4 gemm command #0 'gemm tile 0'"):
        launch(stuck, [4], ahbm)


def test_bad_groups_and_ops_are_named(ahbm):
    with pytest.raises(ValueError, match="names a PE twice"):
        build(lambda ctx: None, [1, 1], ahbm)
    with pytest.raises(ValueError, match="PE 999 is outside"):
        build(lambda ctx: None, [999], ahbm)
    with pytest.raises(ValueError, match="no cost for op 'tanh'"):
        build(lambda ctx: ctx.math("tanh", 10), [0], ahbm)


def test_kernel_contexts_are_freed_without_the_cyclic_collector(ahbm):
    import gc
    import weakref
    from kbtorch.kernel.api import contexts
    ctxs = contexts(ahbm, [0, 1], "k")
    ctxs[0].tcm("x", 1000)
    assert ctxs[1].remote(0, "x").pe == 0
    first = weakref.ref(ctxs[0])
    gc.disable()
    try:
        del ctxs
        assert first() is None
    finally:
        gc.enable()
