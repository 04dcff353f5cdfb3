"""PE model: issue cost, in-order engine queues, semaphores, IPCQ, deadlock reports."""
import pytest

from kbtorch.sim.commands import Compute, Dma, Loc, Send, Signal, Wait
from kbtorch.sim.simulator import SimulationStuck, Simulator


def run(machine, programs, **kw):
    return Simulator(machine, **kw).run(programs)


def test_issue_cost_of_a_typical_composite_is_43_ns(ahbm):
    assert ahbm.issue.cmd_ps(48) == 43_000
    assert ahbm.issue.cmd_ps(0) == 40_000


def test_single_command_latency_is_cpu_issue_scheduler_and_service(ahbm):
    result = run(ahbm, {0: [Compute(8000, engine="gemm")]})   # 8000 flop at 8 TFLOP/s = 1 ns
    launch = ahbm.launch_ps(0)
    assert result.breakdown() == {"launch": launch, "cpu": 2000, "issue": 42000, "scheduler": 1000, "gemm": 1000}
    assert result.latency_ps == launch + 46_000


def test_control_processor_runs_ahead_of_the_engines(ahbm):
    cmds = [Compute(8_000_000, engine="gemm") for _ in range(3)]   # 1 us each
    result = run(ahbm, {0: cmds})
    assert result.latency_ps == ahbm.launch_ps(0) + 2000 + 42000 + 1000 + 3 * 1_000_000
    assert result.breakdown()["issue"] == 42000


def test_busy_engine_takes_issued_commands_without_an_event_each(ahbm):
    # NOTE: commands issued while the engine works join its queue when it looks (lazily).
    cmds = [Compute(8_000_000, engine="gemm") for _ in range(50)]   # 1 us each
    result = run(ahbm, {0: cmds})
    assert result.latency_ps == ahbm.launch_ps(0) + 45_000 + 50 * 1_000_000
    assert result.events <= len(cmds) + 2


def test_idle_engine_starts_a_command_when_it_arrives(ahbm):
    cmds = [Compute(8000, engine="gemm"), Compute(8000, engine="gemm")]   # 1 ns each
    result = run(ahbm, {0: cmds})
    t0 = ahbm.launch_ps(0)
    assert result.latency_ps == t0 + 2000 + 2 * 42000 + 1000 + 1000   # the second arrives after the first ends
    assert result.timeline["gemm"][1][:2] == (t0 + 87_000, t0 + 88_000)


def test_semaphore_orders_commands_across_engines(ahbm):
    produce = Compute(8_000_000, engine="gemm", signals=(Signal("tile"),))
    consume = Compute(1_000_000, engine="math", dtype="f16", waits=(Wait("tile"),))
    result = run(ahbm, {0: [produce, consume]})
    assert result.latency_ps == ahbm.launch_ps(0) + 45_000 + 1_000_000 + 1_000_000
    assert result.breakdown()["gemm"] == 1_000_000 and result.breakdown()["math"] == 1_000_000


def test_wait_threshold_needs_enough_signals(ahbm):
    cmds = [Compute(8000, engine="gemm", signals=(Signal("s"),)), Compute(8000, engine="gemm", signals=(Signal("s"),)),
            Compute(1000, engine="math", waits=(Wait("s", threshold=2),))]
    result = run(ahbm, {0: cmds})
    assert result.latency_ps > run(ahbm, {0: cmds[:2]}).latency_ps


def test_ipcq_message_releases_a_remote_command(ahbm):
    send = Send(dst_pe=255, sem="go")
    remote = Compute(8000, engine="gemm", waits=(Wait("go"),))
    result = run(ahbm, {0: [send], 255: [remote]})
    alone = run(ahbm, {255: [Compute(8000, engine="gemm")]})
    assert result.latency_ps > alone.latency_ps + 100_000   # crosses the SIP ring
    assert "pcie" in result.breakdown()


def test_dma_then_dependent_compute(ahbm):
    pe = ahbm.pes[3]
    load = Dma(Loc(pe.hbm), Loc(pe.node("tcm")), 1 << 16, signals=(Signal("ld"),))
    use = Compute(8000, engine="gemm", waits=(Wait("ld"),))
    result = run(ahbm, {3: [load, use]})
    assert result.breakdown()["hbm"] > 200_000
    assert result.stats["engines"]["dma_rd"]["commands"] == 1
    assert result.stats["engines"]["dma_rd"]["busy_ps"] > 0


def test_stuck_command_is_reported_with_its_correlation_id(ahbm):
    cmds = [Compute(8000, engine="gemm", waits=(Wait("never"),), label="orphan"), Compute(8000, engine="gemm")]
    with pytest.raises(SimulationStuck) as err:
        run(ahbm, {7: cmds})
    text = str(err.value)
    assert "PE 7 gemm command #0 'orphan' (corr" in text and "'never' >= 1 (is 0)" in text
    assert "command #1" in text and len(err.value.commands) == 2


def test_descriptor_over_the_cap_is_rejected(ahbm):
    with pytest.raises(ValueError, match="1025 bytes exceeds the 1024-byte cap"):
        run(ahbm, {0: [Compute(8000, desc=1025, label="big")]})


def test_more_than_two_semaphores_is_rejected():
    with pytest.raises(ValueError, match="up to two Wait"):
        Compute(1, waits=(Wait("a"), Wait("b"), Wait("c")))


def test_unknown_dtype_and_pe_are_named(ahbm):
    with pytest.raises(ValueError, match="no rate for dtype 'int4'"):
        run(ahbm, {0: [Compute(8000, dtype="int4")]})
    with pytest.raises(ValueError, match="PE 256 is outside"):
        run(ahbm, {256: [Compute(8000)]})


def test_result_reports_each_pes_finish(ahbm):
    result = run(ahbm, {0: [Compute(8000)], 9: [Compute(8_000_000)]})
    assert result.pe_finish_ps == {0: ahbm.launch_ps(0) + 46_000, 9: ahbm.launch_ps(9) + 45_000 + 1_000_000}
    assert result.latency_ps == max(result.pe_finish_ps.values())


def test_released_run_is_freed_without_the_cyclic_collector(ahbm):
    import gc
    import weakref
    cmds = [Dma(Loc(ahbm.pes[0].hbm, 0), Loc(ahbm.pes[1].node("tcm"), 0), 4096, signals=(Signal("ld"),)),
            Compute(8000, engine="gemm", waits=(Wait("ld"),))]
    sim = Simulator(ahbm)
    result = sim.run({0: cmds})
    pe, links = weakref.ref(sim.pe(0)), sim.network.links()
    assert links and pe() is not None
    gc.disable()
    try:
        sim.release()
        del sim
        assert pe() is None
    finally:
        gc.enable()
    assert result.latency_ps > 0 and result.stats["engines"]["gemm"]["commands"] == 1
