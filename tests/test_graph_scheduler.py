"""Graph mode's scheduler: concurrency is simulated, never assumed (one simulation of the
joined programs), on the tiny machine (8 PEs)."""
import pytest

from kbtorch.kernel import build
from kbtorch.ops.collective import collective
from kbtorch.ops.vector import elementwise_kernel
from kbtorch.ops.gemm import gemm
from kbtorch.tensor.graph import join, periodic


def _vector(machine, pes, n=1 << 16):
    return build(elementwise_kernel, list(pes), machine, "add", n, 2, 2, "f16", 1, 1.0, name="add")


def _alone(machine, prog):
    return join.simulate([prog], [frozenset()], machine).latency_ps


def test_independent_kernels_on_disjoint_pes_take_the_longer(tiny):
    a, b = _vector(tiny, range(0, 4)), _vector(tiny, range(4, 8), n=1 << 15)
    both = join.simulate([a, b], [frozenset(), frozenset()], tiny)
    longer = max(_alone(tiny, a), _alone(tiny, b))
    assert both.latency_ps == pytest.approx(longer, rel=0.05)
    assert both.result.events > 0 and both.commands >= 8


def test_independent_kernels_on_the_same_pes_take_about_the_sum(tiny):
    # NOTE: many tiles each, so that each alone keeps its PEs' HBM ports busy (with one tile,
    # the second's reads would overlap the first's compute: a real overlap, not a sum)
    a, b = _vector(tiny, range(8), 1 << 21), _vector(tiny, range(8), 1 << 21)
    both = join.simulate([a, b], [frozenset(), frozenset()], tiny).latency_ps
    one = _alone(tiny, a)
    assert 1.6 * one <= both <= 2.05 * one      # the fill and drain of one overlap the other


def test_a_dependent_kernel_waits_on_its_pes_semaphores(tiny):
    a, b = _vector(tiny, range(8)), _vector(tiny, range(8))
    near = [frozenset(), frozenset({0})]
    chained = join.simulate([a, b], [frozenset(), frozenset({0})], tiny, near=near)
    assert chained.ready_ps[1] == chained.finish_ps[0] < chained.finish_ps[1]
    # a consumer on PEs the producer does not use hears of it by an IPCQ relay
    c = _vector(tiny, range(4, 8))
    relayed = join.simulate([_vector(tiny, range(4)), c], [frozenset(), frozenset({0})], tiny, near=near)
    assert relayed.finish_ps[1] > relayed.finish_ps[0] + _alone(tiny, c) * 0.5
    assert any(cmd.label.startswith("kernel 0 done: relay") for cmds in relayed.result.programs.values()
               for cmd in cmds)


def _uneven(machine):
    """A pass whose PE 7 does 16 times the work of PEs 0-6."""
    light, heavy = _vector(machine, range(7), 1 << 12), _vector(machine, [7], 1 << 16)
    return {**light, **heavy}


def test_a_consumer_waits_for_all_of_its_producer_unless_it_reads_only_its_own_pe(tiny):
    """A dependency is a barrier over the producer's PEs (issue 45: a pass reads a GEMM's
    tiles from all its PEs), a near one waits for the same PE's part only."""
    a, b = _uneven(tiny), _vector(tiny, [0], 1 << 10)
    deps = [frozenset(), frozenset({0})]
    barrier = join.simulate([a, b], deps, tiny)
    near = join.simulate([a, b], deps, tiny, near=deps)
    heavy_done = join.simulate([_vector(tiny, [7], 1 << 16)], [frozenset()], tiny).finish_ps[0]
    assert near.finish_ps[1] < heavy_done < barrier.finish_ps[1]
    labels = [c.label for cmds in barrier.result.programs.values() for c in cmds]
    assert sum("done here and below" in x for x in labels) == 7     # PEs 1-7 report up the tree
    # on PE 0, the tree's root: no message to itself, it knows when its children have reported
    assert not any("done everywhere" in x for x in labels)


def test_a_barrier_crosses_chips_only_where_the_producer_ran_on_none():
    """Each chip's PEs report to the chip's first; a chip the producer did not run on hears
    from every chip it ran on (tiny_system: 4 chips x 4 PEs)."""
    from pathlib import Path
    from kbtorch.topology import load_machine
    system = load_machine(str(Path(__file__).parent / "data" / "tiny_system.toml"))
    chips = sorted({system.chip_of(pe) for pe in range(len(system.pes))})
    first = [next(pe for pe in range(len(system.pes)) if system.chip_of(pe) == c) for c in chips]
    a = _vector(system, [pe for pe in range(len(system.pes)) if system.chip_of(pe) == chips[0]])
    b = _vector(system, first)
    programs, _ = join.build([a, b], [frozenset(), frozenset({0})], system)
    sends = [(pe, c.dst_pe, c.sem) for pe, cmds in programs.items() for c in cmds if c.label.startswith("kernel 0")]
    across = [(s, d) for s, d, sem in sends if system.chip_of(s) != system.chip_of(d)]
    assert across == [(first[0], pe) for pe in first[1:]]


def test_a_gemm_beside_a_collective_on_shared_links_is_slower(tiny):
    g = gemm(shape=(512, 512, 512), pes=list(range(8)), machine=tiny).result.programs
    c = collective("all_reduce", group=list(range(8)), nbytes=1 << 20, machine=tiny, algo="ring").result.programs
    alone = _alone(tiny, g)
    both = join.simulate([g, c], [frozenset(), frozenset()], tiny)
    assert both.finish_ps[0] > alone


def test_no_graph_is_faster_than_its_busiest_resource(tiny):
    progs = [_vector(tiny, range(8)), _vector(tiny, range(4)), _vector(tiny, range(2, 8))]
    s = join.simulate(progs, [frozenset(), frozenset({0}), frozenset()], tiny)
    stats = s.result.stats
    busiest = max([link["max_busy_ps"] for link in stats["links"].values()]
                  + [m["busy_ps"] for m in stats["memories"].values()])
    assert s.latency_ps >= busiest > 0


def test_semaphores_are_renamed_apart_and_one_launch_issues_every_command(tiny):
    a, b = _vector(tiny, range(8)), _vector(tiny, range(8))
    programs, commands = join.build([a, b], [frozenset(), frozenset({0})], tiny, near=[frozenset(), frozenset({0})])
    assert commands == sum(len(v) for v in a.values()) + sum(len(v) for v in b.values())
    sems = {s.sem for cmds in programs.values() for cmd in cmds for s in cmd.signals}
    assert sems == {"0.done", "1.done"}


def test_shared_read_keys_are_renamed_apart_per_kernel():
    from kbtorch.sim.commands import Composite, Loc, Move, Share
    read = Move(Loc("hbm0"), 64, share=Share("weights", (0, 1)))
    cmd = Composite(tiles=2, staging=Loc("tcm0"), reads=(read, Move(Loc("hbm0"), 64)))
    renamed = join._rename(cmd, "3.")
    assert renamed.reads[0].share == Share("3.weights", (0, 1)) and renamed.reads[1].share is None
def test_retiming_moves_only_the_paths_through_a_changed_kernel(tiny):
    # a -> b, a -> c, b and c -> d; b's branch (disjoint PEs) longer than c's
    progs = [_vector(tiny, range(4)), _vector(tiny, range(4), 1 << 18), _vector(tiny, range(4, 8)),
             _vector(tiny, range(8))]
    deps = [frozenset(), frozenset({0}), frozenset({0}), frozenset({1, 2})]
    sched = join.simulate(progs, deps, tiny)
    same = join.retime(sched, deps, [0, 0, 0, 0])
    assert same.latency_ps == sched.latency_ps and same.finish_ps == sched.finish_ps
    slack = sched.finish_ps[1] - sched.finish_ps[2]
    assert slack > 0
    hidden = join.retime(sched, deps, [0, 0, slack // 2, 0])          # c grows within b's shadow
    assert hidden.latency_ps == sched.latency_ps
    longer = join.retime(sched, deps, [0, 1000, 0, 0])               # b is on the longest path
    assert longer.latency_ps == sched.latency_ps + 1000
    assert longer.finish_ps[3] == sched.finish_ps[3] + 1000 and sched.result.latency_ps != longer.result.latency_ps


def test_a_prefill_like_graph_is_periodic_with_an_input_every_block_shares():
    # kernel 0 (rotary tables) read by every block's first kernel; blocks of 2 kernels
    sigs = [("tables", frozenset())]
    for b in range(6):
        first = 1 + 2 * b
        sigs += [("qkv", frozenset({0, first - 1}) if b else frozenset({0})), ("mlp", frozenset({first}))]
    per = periodic.period(sigs)
    assert per is not None and per.length == 2 and per.count >= 5


def test_a_relay_crosses_to_each_other_chip_once():
    """A kernel on one chip's PEs, then one on every PE of tiny_system (4 chips x 4 PEs):
    each other chip hears of it by one message between chips, then its PEs tell each other."""
    from pathlib import Path
    from kbtorch.topology import load_machine
    system = load_machine(str(Path(__file__).parent / "data" / "tiny_system.toml"))
    a, b = _vector(system, range(4)), _vector(system, range(16))
    programs, _ = join.build([a, b], [frozenset(), frozenset({0})], system, near=[frozenset(), frozenset({0})])
    relays = [(pe, cmd.dst_pe) for pe, cmds in programs.items() for cmd in cmds
              if cmd.label.startswith("kernel 0 done: relay")]
    across = [(s, d) for s, d in relays if system.chip_of(s) != system.chip_of(d)]
    assert sorted(system.chip_of(d) for _, d in across) == [1, 2, 3]
    assert {d for _, d in relays} == set(range(4, 16))
    run = join.simulate([a, b], [frozenset(), frozenset({0})], system)
    assert run.finish_ps[1] > run.finish_ps[0]
