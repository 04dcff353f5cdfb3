"""The collective tile kernel: packets of several small blocks, their version semaphores,
the block-by-block fallback, and what coalescing buys on the simulator."""
from collections import Counter
from pathlib import Path

import pytest

from kbtorch.ops.collective import collective
from kbtorch.ops.collective.groups import make_grid
from kbtorch.ops.collective.kernel import CollectiveKernel
from kbtorch.ops.collective.schedules import schedule
from kbtorch.ops.collective.steps import Schedule, Xfer
from kbtorch.sim.commands import Composite, Dma
from kbtorch.sim.simulator import Simulator


def kernel(machine, kind, algo, group, nbytes, **kw):
    grid = make_grid(machine, group)
    return CollectiveKernel(machine, schedule(kind, algo, grid), grid, nbytes, 2, "f16", "sum", **kw)


def test_packets_are_runs_inside_aligned_groups(ahbm):
    k = kernel(ahbm, "all_reduce", "hier", tuple(range(16)), 16 << 10)
    assert k.per_packet == 4 and len(k.pieces) == 1
    assert k.packets(Xfer(0, 1, (2, 3, 4, 5, 7), True)) == [(2, 3), (4, 5), (7,)]
    assert k.packets(Xfer(0, 1, (6,), True)) == [(6,)]


def test_a_block_larger_than_a_packet_is_cut_into_pieces(ahbm):
    k = kernel(ahbm, "all_reduce", "ring", tuple(range(8)), 8 << 20)
    assert k.per_packet == 1 and len(k.pieces) == 4
    assert k.packets(Xfer(0, 1, (3,), True)) == [(3,)]


def test_halving_steps_send_their_blocks_in_one_command(ahbm):
    """hier over two CUBEs (lines of 8): reduce-scatter by halving moves 4, 2, 1 blocks; each
    step is one command per member (the first send a DMA, the rest composites, copies fused
    into them or DMAs), so the kernel issues about one command per step."""
    k = kernel(ahbm, "all_reduce", "hier", tuple(range(16)), 1 << 10)
    progs = k.programs()
    sched = k.s
    for pe, cmds in progs.items():
        assert len(cmds) <= len(sched.steps) + 1, [c.label for c in cmds]
    first = progs[0][0]
    assert isinstance(first, Dma) and first.nbytes == 4 * k.block_elems * 2


def test_packets_of_several_blocks_name_their_version_semaphore(ahbm):
    k = kernel(ahbm, "all_reduce", "hier", tuple(range(16)), 1 << 10)
    sems = Counter(s.sem for cmds in k.programs().values() for c in cmds for s in c.signals)
    assert any("-" in name and name.startswith("v") for name in sems)


def _three_producers(ahbm) -> CollectiveKernel:
    """Member 0 reduces block 0 (from 1) and block 1 (from 2) in separate commands, then both
    together (from 3): with one packet for (0, 1) that composite would wait on the arrival and
    on two version semaphores."""
    grid = make_grid(ahbm, (0, 1, 2, 3))
    steps = ((Xfer(1, 0, (0,), True), Xfer(2, 0, (1,), True)), (Xfer(3, 0, (0, 1), True),))
    sched = Schedule("all_reduce", "custom", 4, 2, steps, ((0, 1),) * 4, ((0, 1), (), (), ()))
    return CollectiveKernel(ahbm, sched, grid, 1 << 10, 2, "f16", "sum")


def test_a_packet_whose_blocks_need_three_waits_falls_back_to_block_by_block(ahbm):
    k = _three_producers(ahbm)
    assert k.per_packet == 2
    progs = k.programs()
    assert k.per_packet == 1
    composites = [c for c in progs[0] if isinstance(c, Composite)]
    assert len(composites) == 4 and all(len(c.waits) <= 2 for c in composites)
    res = Simulator(ahbm).run(progs)
    assert res.latency_ps > 0


@pytest.mark.parametrize("kind,algo", [("all_reduce", "hier"), ("reduce_scatter", "tree")])
def test_coalescing_beats_block_by_block_and_keeps_the_bound_a_lower_bound(ahbm, kind, algo):
    """16 KiB over PEs 0-63; a packet of one block's bytes makes the kernel go block by block."""
    run = collective(kind, group="0-63", nbytes=16 << 10, algo=algo, machine=ahbm)
    block = run.nbytes // schedule(kind, algo, make_grid(ahbm, run.pes)).blocks
    single = collective(kind, group="0-63", nbytes=16 << 10, algo=algo, machine=ahbm, packet_bytes=block)
    assert run.packet_bytes > block and single.packet_bytes == block
    assert run.pct_bound <= 100.5 and single.pct_bound <= 100.5
    assert run.latency_ns < 0.9 * single.latency_ns


def test_2d_over_the_whole_machine_issues_few_commands_per_step(ahbm):
    """7 KiB over 256 PEs (28 steps): each transfer is one packet (block by block a member
    issued 256 per phase and the run was issue-bound at 41 us), and the copies that feed one
    forwarding packet count on that packet's semaphore. Measured: at most 33 commands (39
    when each copy had a semaphore of its own and a forward waited on up to six)."""
    k = kernel(ahbm, "all_reduce", "2d", tuple(range(256)), 7 << 10)
    progs = k.programs()
    assert max(len(c) for c in progs.values()) <= 1.25 * len(k.s.steps)


@pytest.fixture(scope="module")
def sprayed_system():
    """tests/data/tiny_system.toml with adaptive port spraying (maia200_x8's policy)."""
    from pathlib import Path

    from kbtorch.topology import load_machine
    return load_machine(str(Path(__file__).resolve().parent / "data" / "tiny_system.toml"),
                        overrides={"routing.policy": "port-spray", "routing.adaptive": True})


def one_pe_per_chip(machine) -> tuple:
    return tuple(next(p for p in range(len(machine.pes)) if machine.chip_of(p) == c) for c in range(machine.chips))


def test_values_stay_in_hbm_when_the_receive_slots_leave_the_tcm_no_room():
    """maia200_x64's ``hier`` all-reduce line (one PE per chip; ``across:chip:4`` at 1 MiB a
    chip): 18 reduction channels x 9 TCM receive slots take what the TCM has, so 256 KiB of
    values per member go to HBM scratch (they failed to allocate); 64 KiB still fit in TCM."""
    from kbtorch.topology import load_machine
    m = load_machine("maia200_x64")
    pes = one_pe_per_chip(m)
    big, small = (kernel(m, "all_reduce", "hier", pes, n) for n in (256 << 10, 64 << 10))
    assert max(len(c) for c in big.chan_in) == 18 and not big.in_tcm and set(big.val0) == {0}
    assert big.ctx[0].largest_free("tcm") < 256 << 10
    assert small.in_tcm and "values" in small.ctx[0].buffers
    assert big.programs()


@pytest.mark.parametrize("sprayed", [False, True])
def test_sprayed_reductions_land_in_hbm_and_keep_a_steps_partial_sums_in_tcm(sprayed_system, sprayed):
    """``direct`` reduce-scatter: each member adds three partial sums of its block in one step.
    Sprayed, they land in the receiver's HBM as copies do, and only the first composite of the
    chain reads the member's own value from HBM (the partial sums stay in TCM); else they land
    in TCM receive slots and every composite reads the value so far from HBM."""
    m = sprayed_system
    grid = make_grid(m, one_pe_per_chip(m))
    k = CollectiveKernel(m, schedule("reduce_scatter", "direct", grid), grid, 4 << 20, 2, "f16", "sum",
                         sprayed=sprayed)
    progs = k.programs()
    kind = lambda loc: m.graph.nodes[loc.node]["kind"]  # noqa: E731
    sends = [c for cmds in progs.values() for c in cmds if isinstance(c, Dma) and " red " in c.label]
    comps = [c for cmds in progs.values() for c in cmds if isinstance(c, Composite)]
    assert sends and len(comps) == len(sends) == 4 * 3 * len(k.pieces)
    assert {kind(c.dst) for c in sends} == {"hbm" if sprayed else "tcm"}
    hbm_reads = sum(kind(mv.loc) == "hbm" for c in comps for mv in c.reads)
    # sprayed: every landed packet, plus the own value once per member and piece
    assert hbm_reads == (len(comps) + 4 * len(k.pieces) if sprayed else len(comps))


def test_sprayed_rounds_are_software_pipelined(sprayed_system):
    """Sprayed, step k of round r is emitted with step 0 of round r + k (newest round first):
    every (round, step) after its predecessors in both, all of them once."""
    m = sprayed_system
    grid = make_grid(m, one_pe_per_chip(m))
    k = CollectiveKernel(m, schedule("all_reduce", "hier", grid), grid, 8 << 20, 2, "f16", "sum")
    order = [(r, s) for r, s, _, _ in k._order()]
    steps, rounds = len(k.s.steps), -(-len(k.pieces) // k.round)
    assert rounds > 2 and sorted(order) == [(r, s) for r in range(rounds) for s in range(steps)]
    at = {rs: i for i, rs in enumerate(order)}
    assert all(at[(r, s)] > at[(r, s - 1)] for r, s in order if s)
    assert all(at[(r, s)] > at[(r - 1, s)] for r, s in order if r)
    assert at[(1, 0)] < at[(0, 1)]
    plain = CollectiveKernel(m, k.s, grid, 8 << 20, 2, "f16", "sum", sprayed=False)
    assert [(r, s) for r, s, _, _ in plain._order()][:steps] == [(0, s) for s in range(steps)]


def test_port_spray_leaves_a_group_inside_one_chip_as_on_one_path():
    """Under ``port-spray`` only traffic between chips is sprayed: a reduction inside one
    chip keeps the single-path kernel (TCM receive slots), one across chips lands in HBM;
    ``minimal-spray`` sprays inside a chip too."""
    from kbtorch.ops.collective.kernel_layout import sprayed_reductions
    from kbtorch.topology import load_machine
    path = str(Path(__file__).parent / "data" / "tiny_system.toml")
    single, spray, minimal = (load_machine(path, overrides={"routing.policy": p})
                              for p in ("single", "port-spray", "minimal-spray"))
    chip, every = list(range(len(spray.chip.pes))), list(range(len(spray.pes)))
    assert not sprayed_reductions(spray, chip) and sprayed_reductions(spray, every)
    assert sprayed_reductions(minimal, chip) and not sprayed_reductions(single, every)
    lat = [collective("reduce_scatter", group=chip, algo="ring", machine=m, nbytes=256 * 1024,
                      dtype="bf16").result.latency_ps for m in (single, spray)]
    assert lat[0] == lat[1]
