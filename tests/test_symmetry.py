"""Symmetry reduction: a reduced run equals the full run in latency, attribution and counters."""
from pathlib import Path

import pytest

from kbtorch.kernel import build, launch, run_programs
from kbtorch.ops.collective import collective
from kbtorch.ops.collective.groups import make_grid, resolve_group
from kbtorch.ops.collective.kernel import CollectiveKernel
from kbtorch.ops.collective.schedules import schedule
from kbtorch.ops.vector import elementwise_kernel
from kbtorch.ops.gemm import simulate
from kbtorch.ops.gemm_kernel import gemm_kernel
from kbtorch.ops.gemm_plan import GemmTiling, plan
from kbtorch.sim import symmetry
from kbtorch.sim.simulator import Simulator
from kbtorch.topology.load.pipeline import resolve_doc
from kbtorch.topology.machine import Machine


def _same(full, red):
    assert red.latency_ps == full.latency_ps
    assert red.breakdown() == full.breakdown()
    assert red.pe_finish_ps == full.pe_finish_ps
    assert red.stats["memories"] == full.stats["memories"]
    assert red.stats["engines"] == full.stats["engines"]
    assert red.stats["links"] == full.stats["links"]
    assert red.events < full.events


@pytest.mark.parametrize("n", [3584, 1000003])
def test_elementwise_reduced_equals_full(ahbm, n):
    args = (elementwise_kernel, range(256), ahbm, "add", n, 2, 2, "bf16", 1, 1.0)
    _same(launch(*args, symmetric=False), launch(*args))


@pytest.mark.parametrize("tiling", [GemmTiling((4, 8, 1), (64, 64, 128)), GemmTiling((1, 4, 8), (1, 64, 256))])
def test_gemm_reduced_equals_full(ahbm, tiling):
    pes = list(range(32))
    m, n, k = (256, 512, 256) if tiling.grid[0] > 1 else (1, 512, 4096)
    full = simulate(ahbm, m, n, k, "bf16", pes, tiling)
    shards = {s.pe: s for s in plan(m, n, k, pes, tiling)}
    programs = build(gemm_kernel, pes, ahbm, shards, tiling, "bf16", True)
    _same(Simulator(ahbm).run(programs), full)


def test_units_launched_at_different_times_share_a_class(ahbm):
    # NOTE: the kernel launch reaches PEs at 13 distinct times; a unit launched later runs the
    # same run shifted, and its class is represented by its member launched last.
    programs = build(elementwise_kernel, range(256), ahbm, "add", 3584, 2, 2, "bf16", 1, 1.0)
    red = symmetry.reduce(ahbm, programs)
    start = {pe.prefix: ahbm.launch_ps(pe.id) for pe in ahbm.pes}
    unit_start = {u: min(t for p, t in start.items() if p.startswith(u)) for m in red.members.values() for u in m}
    assert len(set(start.values())) > 1 and len(red.members) < len(set(start.values()))
    for rep, members in red.members.items():
        assert all(unit_start[rep] >= unit_start[u] for u in members)
        assert all(red.shift_ps[u] == unit_start[u] - unit_start[rep] for u in members)


def test_units_with_a_pcie_shortcut_are_their_own_class(ahbm):
    # CUBEs 7 and 8 of each SIP reach their own routers through a PCIe endpoint as well:
    # their routes differ, so they never stand for the other CUBEs. CUBEs whose PEs' kernel
    # launches arrive in another order (the launch enters from another side) are another class.
    def kernel(ctx):
        first = ctx.pe // 8 * 8
        if ctx.pe != first:
            ctx.dma_write(ctx.tcm("buf", 4096), ctx.machine.pes[first].node("tcm"), 4096)
    programs = build(kernel, range(256), ahbm)
    red = symmetry.reduce(ahbm, programs)
    sizes = sorted(len(m) for m in red.members.values())
    assert sum(sizes) == 32 and len(sizes) >= 2 and sizes[-1] >= 8
    shortcut = {f"sip{s}.cube{c}." for s in range(2) for c in (7, 8)}
    assert all(len(shortcut.intersection(m)) in (0, len(m)) for m in red.members.values())


def test_traffic_between_units_is_not_reduced(ahbm):
    def kernel(ctx):
        peer = (ctx.pe + 8) % len(ctx.group)
        ctx.dma_read(ctx.machine.pes[peer].hbm, ctx.tcm("buf", 4096).loc(), 4096)
    programs = build(kernel, range(16), ahbm)
    assert not symmetry.reduce(ahbm, programs).reduced


def test_trace_runs_are_never_reduced(ahbm):
    args = (elementwise_kernel, range(16), ahbm, "add", 4096, 2, 2, "bf16", 1, 1.0)
    assert launch(*args, trace=True).events == launch(*args, symmetric=False).events


# ---- systems of chips (issue 23): identical chips are simulated once where their work is independent ----
SYSTEM = str(Path(__file__).resolve().parent / "data" / "tiny_system.toml")


def _system(edit=None, routing=None):
    """A fresh tiny_system machine (not the cached one): ``edit(graph)`` changes its hardware,
    ``routing`` sets its ``[routing]`` table."""
    doc = resolve_doc(SYSTEM)
    if routing is not None:
        doc["routing"] = routing
    m = Machine(SYSTEM, doc=doc)
    if edit is not None:
        edit(m.graph)
        m.digest += "+edited"       # NOTE: machines are equal (and cached) by content: this one differs
    return m


def _per_chip_all_reduce(m, nbytes=64 * 1024):
    """A ring all-reduce inside every chip, all chips at once: -> (programs, chips' PEs)."""
    chips = [resolve_group(m, f"chip:{c}") for c in range(m.chips)]
    programs = {}
    for pes in chips:
        sched = schedule("all_reduce", "ring", make_grid(m, pes))
        programs.update(CollectiveKernel(m, sched, make_grid(m, pes), nbytes, 2, "bf16", "sum").programs())
    return programs, chips


@pytest.mark.parametrize("routing", [None, {"policy": "port-spray", "port_kind": "nic"}])
def test_identical_chips_are_simulated_once(routing):
    m = _system(routing=routing)
    programs, _ = _per_chip_all_reduce(m)
    red = symmetry.reduce(m, programs)
    assert len(red.members) == 1 and len(next(iter(red.members.values()))) == 4
    assert {p.split(".")[1] for p in next(iter(red.members.values()))} == {"chip0", "chip1"}
    _same(run_programs(programs, m, symmetric=False), run_programs(programs, m))


def test_a_chip_that_differs_is_its_own_class():
    def slow_chip3(g):
        for u, v, d in g.edges(data=True):
            if u.startswith("tray1.chip1.") and d["kind"] == "noc":
                d["flit_ps"] *= 2
    m = _system(slow_chip3)
    programs, chips = _per_chip_all_reduce(m)
    red = symmetry.reduce(m, programs)
    assert sorted(len(g) for g in red.members.values()) == [1, 3]
    assert "tray1.chip1." in red.members
    full = run_programs(programs, m, symmetric=False)
    _same(full, run_programs(programs, m))
    assert max(full.pe_finish_ps[p] for p in chips[3]) > max(full.pe_finish_ps[p] for p in chips[0])


def test_copies_of_the_first_chips_programs_reduce_as_reduce_finds():
    m = _system()
    programs, chips = _per_chip_all_reduce(m)
    first = {pe: programs[pe] for pe in chips[0]}
    img = symmetry.images(m, first, chips)
    assert img.members == symmetry.reduce(m, programs).members and img.programs == first
    _same(run_programs(programs, m, symmetric=False), run_programs(programs, m, reduction=img))


def test_copies_are_refused_unless_every_unit_is_like_the_first():
    def slow_chip3(g):
        for u, v, d in g.edges(data=True):
            if u.startswith("tray1.chip1.") and d["kind"] == "noc":
                d["flit_ps"] *= 2
    m = _system()
    programs, chips = _per_chip_all_reduce(m)
    first = {pe: programs[pe] for pe in chips[0]}
    assert symmetry.images(m, first, [chips[0], chips[1][::-1]]) is None       # other names
    assert symmetry.images(m, first, [chips[0], chips[0]]) is None             # one unit twice
    assert symmetry.images(m, first, [chips[0], chips[1][:-1]]) is None        # not the same PEs
    slow = _system(slow_chip3)
    assert symmetry.images(slow, first, chips) is None                         # other hardware
    per = len(m.chip.pes)
    lines = [[0, per], [1, per + 1]]                                            # across chips
    across = collective("all_reduce", group=lines[0], machine=m, nbytes=4096, dtype="bf16", algo="ring")
    assert symmetry.images(m, across.result.programs, lines) is None


@pytest.mark.parametrize("group", ["across:chip", "all"])
def test_a_collective_across_chips_is_not_reduced(group):
    m = _system()
    run = collective("all_reduce", group=group, machine=m, nbytes=64 * 1024, dtype="bf16", algo="ring")
    assert not symmetry.reduce(m, run.result.programs).reduced
    assert "represented_units" not in run.result.stats
