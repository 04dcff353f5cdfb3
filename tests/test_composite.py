"""Composite commands: stages stream tiles with overlap; the same work as chained commands is slower."""
import pytest

from kbtorch.sim.commands import Composite, Compute, Dma, Fetch, Loc, Move, Signal, Store, Wait
from kbtorch.sim.simulator import Simulator

TILE = 128 * 128 * 2          # one f16 128x128 operand tile (bytes)
FLOPS = 2 * 128 ** 3          # one 128^3 tile product


def gemm_composite(pe, tiles, buffers=2, accumulate=None):
    tcm = pe.node("tcm")
    return Composite(tiles=tiles, staging=Loc(tcm, 0), buffers=buffers, accumulate=accumulate or tiles,
                     reads=(Move(Loc(pe.hbm, 0), TILE, TILE), Move(Loc(pe.hbm, 1 << 26), TILE, TILE)),
                     fetch_bytes=2 * TILE, flops=FLOPS, store_bytes=2 * TILE,
                     writes=(Move(Loc(pe.hbm, 1 << 27), TILE, TILE),), label="gemm tiles")


def chained(pe, tiles):
    """The same work as individual commands chained by semaphores."""
    tcm, cmds = pe.node("tcm"), []
    for i in range(tiles):
        cmds += [Dma(Loc(pe.hbm, i * TILE), Loc(tcm, 0), TILE, signals=(Signal("a"),)),
                 Dma(Loc(pe.hbm, (1 << 26) + i * TILE), Loc(tcm, TILE), TILE, signals=(Signal("b"),)),
                 Fetch(2 * TILE, waits=(Wait("a"), Wait("b"))), Compute(FLOPS)]
    return cmds + [Store(2 * TILE, signals=(Signal("c"),)),
                   Dma(Loc(tcm, 0), Loc(pe.hbm, 1 << 27), TILE, engine="dma_wr", waits=(Wait("c"),))]


def test_descriptor_size_and_issue_cost(ahbm):
    cmd = gemm_composite(ahbm.pes[0], 4)
    assert cmd.descriptor(ahbm.issue) == 32 + 3 * 16 + 3 * 8
    assert ahbm.issue.cmd_ps(cmd.descriptor(ahbm.issue)) == 46_500


def test_compute_bound_pipeline_overlaps_stages(ahbm):
    tiles = 16
    result = Simulator(ahbm).run({0: [gemm_composite(ahbm.pes[0], tiles)]})
    ideal = tiles * FLOPS / 8     # ps at 8 TFLOP/s
    assert result.breakdown()["gemm"] == tiles * FLOPS // 8
    assert ideal < result.latency_ps < 1.12 * ideal


def test_chained_commands_do_the_same_work_slower(ahbm):
    pe = ahbm.pes[0]
    comp = Simulator(ahbm).run({0: [gemm_composite(pe, 8)]})
    chain = Simulator(ahbm).run({0: chained(pe, 8)})
    assert chain.latency_ps > comp.latency_ps
    assert chain.breakdown()["gemm"] == comp.breakdown()["gemm"]


def test_single_buffering_serialises_read_and_compute(ahbm):
    pe = ahbm.pes[0]
    double = Simulator(ahbm).run({0: [gemm_composite(pe, 8, buffers=2)]}).latency_ps
    single = Simulator(ahbm).run({0: [gemm_composite(pe, 8, buffers=1)]}).latency_ps
    assert single > double * 1.1


def test_accumulate_stores_once_per_group(ahbm):
    pe = ahbm.pes[0]
    result = Simulator(ahbm).run({0: [gemm_composite(pe, 8, accumulate=4)]})
    written = TILE // 256 * 2     # two stored tiles
    read = 8 * 2 * TILE // 256
    assert result.stats["memories"][pe.hbm]["bursts"] == read + written


def test_composite_signals_when_done(ahbm):
    pe = ahbm.pes[0]
    comp = gemm_composite(pe, 2)
    comp = Composite(**{**comp.__dict__, "signals": (Signal("done"),)})
    after = Compute(8000, engine="math", waits=(Wait("done"),))
    result = Simulator(ahbm).run({0: [comp, after]})
    alone = Simulator(ahbm).run({0: [gemm_composite(pe, 2)]})
    assert result.latency_ps >= alone.latency_ps + 1000


def test_bad_composites_are_named(ahbm):
    tcm = ahbm.pes[0].node("tcm")
    with pytest.raises(ValueError, match="at least one stage"):
        Simulator(ahbm).run({0: [Composite(tiles=2, staging=Loc(tcm), label="empty")]})
    with pytest.raises(ValueError, match="tiles, buffers and accumulate"):
        Composite(tiles=0, staging=Loc(tcm))
