"""Collectives side by side (``ops/collective/side_by_side.py``): groups sharing HBM controllers
and links in one simulation, the algorithm of lines of a mesh, and programs built once."""
from pathlib import Path

import pytest

from kbtorch.kernel import run_programs
from kbtorch.ops.collective import (LINE_ALGOS, CollectiveError, Request, collective, concurrent, estimates, line_algo,
                                    on_groups, on_groups_run)
from kbtorch.ops.collective.groups import make_grid
from kbtorch.sim import symmetry
from kbtorch.topology import load_machine

DATA = Path(__file__).parent / "data"


def test_concurrent_collectives_share_hbm_controllers(ahbm):
    even = dict(kind="all_reduce", group="0,2,4,6", nbytes=4 << 20, algo="ring")
    odd = dict(kind="all_reduce", group="1,3,5,7", nbytes=4 << 20, algo="ring")
    [alone] = concurrent([even], machine=ahbm)
    together = concurrent([even, odd], machine=ahbm)
    assert len(together) == 2
    for t in together:
        assert alone * 1.05 < t < alone * 2.05, (alone, together)


def test_concurrent_groups_must_not_share_a_pe(ahbm):
    with pytest.raises(CollectiveError, match=r"collective 1 \(all_reduce\): PE 2 is already in another"):
        concurrent([dict(kind="all_reduce", group="0,2,4,6", nbytes=4096, algo="ring"),
                    dict(kind="all_reduce", group="1,2,3", nbytes=4096, algo="ring")], machine=ahbm)


def test_on_groups_is_auto_in_grid_order_alone_and_the_best_line_algorithm_side_by_side(tiny):
    one = collective("all_gather", group=[0, 1, 2, 3], nbytes=4096, algo="auto", order="grid", machine=tiny)
    assert on_groups("all_gather", [(0, 1, 2, 3)], nbytes=4096, machine=tiny) == (one.latency_ns, one.algo)
    algo = line_algo("all_reduce", [(0, 1, 2, 3), (4, 5, 6, 7)], 4096, "f16", tiny)
    est = estimates(Request("all_reduce", tiny, nbytes=4096), make_grid(tiny, [0, 1, 2, 3]))
    assert algo in LINE_ALGOS and est[algo] == min(v for a, v in est.items() if a in LINE_ALGOS)
    specs = [dict(kind="all_reduce", group=list(g), nbytes=4096, algo=algo) for g in ((0, 1, 2, 3), (4, 5, 6, 7))]
    both = on_groups("all_reduce", [(0, 1, 2, 3), (4, 5, 6, 7)], nbytes=4096, machine=tiny)
    assert both == (max(concurrent(specs, machine=tiny)), algo) and both[0] > 0


def test_lines_each_inside_a_chip_of_its_own_take_any_algorithm():
    """Groups on chips of their own share no link: every algorithm, as one group's ``auto``
    chooses."""
    system = load_machine(str(DATA / "tiny_system.toml"))
    per_chip = len(system.chip.pes)
    inside = [tuple(range(c * per_chip, (c + 1) * per_chip)) for c in range(system.chips)]
    best = collective("reduce_scatter", group=list(inside[0]), nbytes=2**16, machine=system).algo
    assert best not in LINE_ALGOS and line_algo("reduce_scatter", inside, 2**16, "f16", system) == best


@pytest.mark.parametrize("kind,nbytes", [("all_reduce", 2**12), ("all_gather", 2**12), ("all_gather", 2**20),
                                         ("reduce_scatter", 2**20)])
def test_lines_across_chips_choose_with_the_bound_of_all_lines_together(kind, nbytes):
    """Lines across chips take any algorithm, ranked as ``across:chip`` ranks them (the larger
    of one line's estimate and the bound of all lines built together): the run is the
    chosen algorithm's concurrent run, never slower than tree's (the least one-line estimate
    here), and direct or bidir-ring win where their shared links allow."""
    from kbtorch.ops.collective.build import BLOCKED
    from kbtorch.ops.collective.choice import choose
    system = load_machine(str(DATA / "tiny_system.toml"))
    per_chip = len(system.chip.pes)
    across = [tuple(c * per_chip + p for c in range(system.chips)) for p in range(per_chip)]
    per = 2 * (system.chips if kind in BLOCKED else 1)
    cands = choose(Request(kind, system, nbytes=nbytes), across, sizes=[nbytes // per] * per_chip).candidates
    ns, algo, _ = on_groups_run(kind, across, nbytes=nbytes, dtype="f16", machine=system)
    assert algo == min(cands, key=cands.get) == line_algo(kind, across, nbytes, "f16", system)

    def side_by_side(a):
        return max(concurrent([dict(kind=kind, group=list(g), nbytes=nbytes, dtype="f16", algo=a) for g in across],
                              machine=system, mode="auto"))
    assert ns == side_by_side(algo) <= side_by_side("tree")
    assert algo != "tree" or kind == "all_reduce"


@pytest.mark.parametrize("lines", ["inside", "across"])
def test_side_by_side_groups_like_the_first_take_its_programs_renamed(monkeypatch, lines):
    """Groups of one collective side by side build the first group's kernel once and rename
    its programs to the others (``ops/collective/rename.py``): the run is the one of every group
    built on its own."""
    import kbtorch.ops.collective.side_by_side as cc
    system = load_machine(str(DATA / "tiny_system.toml"))
    per_chip = len(system.chip.pes)
    groups = ([list(range(c * per_chip, (c + 1) * per_chip)) for c in range(system.chips)] if lines == "inside"
              else [[c * per_chip + p for c in range(system.chips)] for p in range(per_chip)])
    specs = [dict(kind="all_reduce", group=g, nbytes=2**14, algo="ring") for g in groups]
    built = {}
    for i, spec in enumerate(specs):
        built.update(cc._kernel(system, i, spec, make_grid(system, spec["group"])).programs())
    calls, ran = [], []
    real = cc._kernel
    monkeypatch.setattr(cc, "_kernel", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(cc, "run_programs", lambda progs, machine, mode, **kw: ran.append(progs) or run_programs(
        progs, machine, mode=mode, **kw))
    cc.concurrent_run(specs, machine=system)
    assert len(calls) == 1 and ran == [built]

def test_groups_inside_chips_run_the_kernel_their_choice_built(monkeypatch):
    """Lines each inside a chip of their own: ``line_algo``'s choice builds the first line's
    kernels (``choice.choose``); the run takes the chosen one as built, not built again."""
    import kbtorch.ops.collective.side_by_side as cc
    system = load_machine(str(DATA / "tiny_system.toml"))
    per_chip = len(system.chip.pes)
    groups = [list(range(c * per_chip, (c + 1) * per_chip)) for c in range(system.chips)]
    algo = line_algo("reduce_scatter", groups, 2**16, "f16", system)
    alone = {}
    for i, g in enumerate(groups):
        spec = dict(kind="reduce_scatter", group=g, nbytes=2**16, algo=algo)
        alone.update(cc._kernel(system, i, spec, make_grid(system, g)).programs())
    calls, ran = [], []
    real = cc._kernel
    monkeypatch.setattr(cc, "_kernel", lambda *a: calls.append(a) or real(*a))
    monkeypatch.setattr(cc, "run_programs", lambda progs, machine, mode, **kw: ran.append(progs) or run_programs(
        progs, machine, mode=mode, **kw))
    monkeypatch.setattr(symmetry, "reduce", lambda *a: pytest.fail("the copies were canonicalised"))
    ns, got, res = on_groups_run("reduce_scatter", groups, nbytes=2**16, dtype="f16", machine=system)
    assert got == algo and not calls and ran == [alone]
    # NOTE: the chips' programs are copies of the first's: one chip simulated (``symmetry.images``)
    assert res.stats["represented_units"] == system.chips
    assert res.pe_finish_ps == run_programs(alone, system, symmetric=False).pe_finish_ps
