"""Collective schedules and groups: symbolic verification, the torch interpretation of every
schedule against torch itself, group resolution and the grids groups form."""
import pytest
import torch

from kbtorch.cli_collective import COLLECTIVE_ALGOS
from kbtorch.ops.collective import torch_reference
from kbtorch.ops.collective.algorithms import ALGORITHMS, ALGOS, LINE_ALGOS
from kbtorch.ops.collective.algorithms.registry import algorithm
from kbtorch.ops.collective.groups import make_grid, resolve_group
from kbtorch.ops.collective.request import KINDS, CollectiveError
from kbtorch.ops.collective.schedules import reference, schedule, verify
from kbtorch.ops.collective.steps import Schedule, Xfer
from kbtorch.ops.contract import family
from kbtorch.topology import load_machine


@pytest.fixture(scope="module")
def torus6():
    return load_machine("torus6")


@pytest.fixture(scope="module")
def machines(ahbm, torus6):
    return {"ahbm": ahbm, "torus6": torus6}


def grid_of(machine, spec):
    return make_grid(machine, resolve_group(machine, spec))


# (topology, group) pairs the schedules are checked on: a CUBE, a SIP, the whole AHBM, a
# non-power-of-two group, a two-cube 4x2 grid and a whole 3-D torus (48 members).
VERIFY_GROUPS = [("ahbm", "cube"), ("ahbm", "sip"), ("ahbm", "all"), ("ahbm", "0-5"), ("ahbm", "0-3,8-11"),
                 ("torus6", "all")]
# Smaller grids for the torch interpretation (the whole machine would be slow for no gain).
REFERENCE_GROUPS = [("ahbm", "cube"), ("ahbm", "0-5"), ("ahbm", "0-3,8-11"), ("torus6", "0,8,16,24,32,40")]


def _power_of_two(n):
    return n & (n - 1) == 0


# ---- verify -------------------------------------------------------------------------------

@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kind", [k for k in KINDS if k != "broadcast"])
@pytest.mark.parametrize("topo,group", VERIFY_GROUPS, ids=[f"{t}-{g}" for t, g in VERIFY_GROUPS])
def test_verify_every_reduction_and_gather(machines, topo, group, kind, algo):
    grid = grid_of(machines[topo], group)
    n = len(grid.pes)
    if algo == "tree" and kind in ("reduce_scatter", "all_gather") and not _power_of_two(n):
        with pytest.raises(CollectiveError, match="power-of-two"):
            schedule(kind, algo, grid)
        return
    try:
        sched = schedule(kind, algo, grid)
    except CollectiveError as exc:
        # NOTE: an algorithm may not apply to a kind (tree, bidir-ring: all-to-all); it says so by name
        assert f"algorithm '{algo}' does not apply to {kind}" in str(exc)
        return
    assert (sched.kind, sched.algo, sched.n) == (kind, algo, n)
    assert sched.blocks % n == 0 or (kind, algo) in (("all_reduce", "tree"), ("all_reduce", "hier"))
    assert sched.transfers > 0
    verify(sched)


@pytest.mark.parametrize("topo,group", [("ahbm", "all"), ("ahbm", "sip"), ("ahbm", "0-3,8-11"), ("torus6", "all")])
def test_2d_all_reduce_moves_consecutive_blocks(machines, topo, group):
    """The multi-dimensional all-reduce numbers its blocks in coordinate order, so every
    transfer's blocks are consecutive (one packet each when they fit): on all 256 AHBM PEs a
    transfer of the first phase carries 32 blocks."""
    grid = grid_of(machines[topo], group)
    sched = schedule("all_reduce", "2d", grid)
    verify(sched)
    for step in sched.steps:
        for x in step:
            assert x.blocks == tuple(range(x.blocks[0], x.blocks[0] + len(x.blocks)))
    if group == "all" and topo == "ahbm":
        assert len(sched.steps[0][0].blocks) == 256 // grid.dims[0]


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("topo,group", VERIFY_GROUPS, ids=[f"{t}-{g}" for t, g in VERIFY_GROUPS])
def test_verify_broadcast_from_several_roots(machines, topo, group, algo):
    grid = grid_of(machines[topo], group)
    n = len(grid.pes)
    for root in sorted({0, 1, n // 2 + 1, n - 1}):
        sched = schedule("broadcast", algo, grid, root)
        assert sched.holds[root] and not any(sched.holds[m] for m in range(n) if m != root)
        verify(sched)


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
def test_tree_all_reduce_works_on_non_power_of_two_but_halving_does_not(ahbm, kind):
    grid = grid_of(ahbm, "0-5")
    if kind == "all_reduce":
        verify(schedule(kind, "tree", grid))
    else:
        with pytest.raises(CollectiveError, match=r"power-of-two.*6 members"):
            schedule(kind, "tree", grid)


def _tampered(sched, steps):
    return Schedule(sched.kind, sched.algo, sched.n, sched.blocks, tuple(tuple(s) for s in steps), sched.holds,
                    sched.keeps)


def test_verify_rejects_broken_schedules(ahbm):
    """verify is the guard of every schedule: it must catch a lost step, a block reduced twice
    and a send of a block the sender does not have."""
    good = schedule("all_reduce", "ring", grid_of(ahbm, "cube"))
    verify(good)
    with pytest.raises(CollectiveError, match="incomplete"):
        verify(_tampered(good, good.steps[:-1]))
    first = good.steps[0]
    with pytest.raises(CollectiveError, match="counted twice"):
        verify(_tampered(good, [first + (first[0],)] + list(good.steps[1:])))
    ag = schedule("all_gather", "ring", grid_of(ahbm, "cube"))
    x = ag.steps[0][0]
    bogus = Xfer(x.src, x.dst, tuple(b for b in range(ag.blocks) if b not in ag.holds[x.src])[:1], False)
    with pytest.raises(CollectiveError, match="does not have"):
        verify(_tampered(ag, [(bogus,)] + list(ag.steps)))


@pytest.mark.parametrize("topo,group", [("ahbm", "all"), ("ahbm", "sip"), ("ahbm", "0-3,8-11"), ("torus6", "all")])
@pytest.mark.parametrize("kind", ["reduce_scatter", "all_gather"])
def test_2d_in_grid_order_moves_consecutive_blocks(machines, topo, group, kind):
    """``order="grid"``: member i's block is its rank in coordinate order, so a 2d
    reduce-scatter or all-gather moves consecutive blocks (in rank order they are strided)."""
    grid = grid_of(machines[topo], group)
    sched = schedule(kind, "2d", grid, order="grid")
    verify(sched)
    rank = sorted(range(sched.n), key=lambda m: grid.coords[m])
    mine = sched.keeps if kind == "reduce_scatter" else sched.holds
    assert [b for m in rank for b in mine[m]] == list(range(sched.blocks))
    for step in sched.steps:
        for x in step:
            assert x.blocks == tuple(range(x.blocks[0], x.blocks[0] + len(x.blocks)))
    if group == "all" and topo == "ahbm":
        strided = schedule(kind, "2d", grid).steps[0 if kind == "reduce_scatter" else -1][0].blocks
        assert strided[1] - strided[0] > 1


def test_schedule_rejects_bad_arguments(ahbm):
    grid = grid_of(ahbm, "cube")
    with pytest.raises(CollectiveError, match=r"unknown collective 'gather'.*all_reduce"):
        schedule("gather", "ring", grid)
    with pytest.raises(CollectiveError, match=r"unknown algorithm 'ring2'.*bidir-ring"):
        schedule("all_reduce", "ring2", grid)
    for root in (-1, 8):
        with pytest.raises(CollectiveError, match=rf"root {root} is not a member rank \(0..7\)"):
            schedule("broadcast", "ring", grid, root)
    with pytest.raises(CollectiveError, match=r"unknown block order 'torch'.*rank, grid"):
        schedule("reduce_scatter", "ring", grid, order="torch")


# ---- reference vs torch -------------------------------------------------------------------

@pytest.mark.parametrize("op", ["sum", "max"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("topo,group", REFERENCE_GROUPS, ids=[f"{t}-{g}" for t, g in REFERENCE_GROUPS])
def test_reference_equals_torch(machines, topo, group, algo, op):
    grid = grid_of(machines[topo], group)
    n = len(grid.pes)
    gen = torch.Generator().manual_seed(n)
    for kind in KINDS:
        root = n // 2 + 1 if kind == "broadcast" else 0
        try:
            sched = schedule(kind, algo, grid, root)
        except CollectiveError as exc:
            assert (algo == "tree" and not _power_of_two(n)) or f"algorithm '{algo}' does not apply to {kind}" in str(exc)
            continue
        per_member = 3 * sched.blocks
        numel = per_member // n if kind in ("all_gather", "all_to_all") else per_member
        shards = [torch.randn(numel, generator=gen) for _ in range(n)]
        out = reference(sched, shards, op)
        want = torch_reference(kind, shards, op, root)
        assert len(out) == n
        for m in range(n):
            assert out[m].dtype == torch.float32
            assert out[m].shape == want[m].shape, (kind, m)
            if op == "max" or kind in ("all_gather", "broadcast", "all_to_all"):
                assert torch.equal(out[m], want[m]), (kind, m)
            else:
                torch.testing.assert_close(out[m], want[m], rtol=1e-5, atol=1e-5)


def test_reference_reduce_scatter_chunk_and_all_gather_order(ahbm):
    """Member i of a reduce-scatter gets chunk i; an all-gather concatenates in member order,
    also on a grid whose ring order is not the member order."""
    grid = grid_of(ahbm, "0-3,8-11")
    assert grid.order != list(range(8))
    x = [torch.arange(16, dtype=torch.float32) * (m + 1) for m in range(8)]
    total = torch.arange(16, dtype=torch.float32) * 36
    for algo in ALGOS:
        rs = reference(schedule("reduce_scatter", algo, grid), x)
        for m in range(8):
            assert torch.equal(rs[m], total[2 * m:2 * m + 2]), (algo, m)
        own = [torch.full((2,), float(m)) for m in range(8)]
        ag = reference(schedule("all_gather", algo, grid), own)
        assert all(torch.equal(o, torch.arange(8.0).repeat_interleave(2)) for o in ag), algo


def test_reference_in_grid_order_gives_each_member_the_chunk_of_its_rank(ahbm):
    grid = grid_of(ahbm, "0-3,8-11")
    rank = sorted(range(8), key=lambda m: grid.coords[m])
    assert rank != list(range(8))
    x = [torch.arange(16, dtype=torch.float32) * (m + 1) for m in range(8)]
    total = torch.arange(16, dtype=torch.float32) * 36
    for algo in ALGOS:
        rs = reference(schedule("reduce_scatter", algo, grid, order="grid"), x)
        for i, m in enumerate(rank):
            assert torch.equal(rs[m], total[2 * i:2 * i + 2]), (algo, m)
        own = [torch.full((2,), float(m)) for m in range(8)]
        ag = reference(schedule("all_gather", algo, grid, order="grid"), own)
        want = torch.tensor(rank, dtype=torch.float32).repeat_interleave(2)
        assert all(torch.equal(o, want) for o in ag), algo


def test_reference_rejects_bad_input(ahbm):
    sched = schedule("all_reduce", "ring", grid_of(ahbm, "cube"))
    with pytest.raises(CollectiveError, match="unknown reduction 'min'"):
        reference(sched, [torch.zeros(16)] * 8, "min")
    with pytest.raises(CollectiveError, match="do not split into 8 equal blocks"):
        reference(sched, [torch.zeros(12)] * 8)


# ---- groups -------------------------------------------------------------------------------

def test_group_names(ahbm, torus6):
    assert resolve_group(ahbm, "all") == tuple(range(256))
    assert resolve_group(ahbm, "cube") == tuple(range(8))
    assert resolve_group(ahbm, "cube:3") == tuple(range(24, 32))
    assert resolve_group(ahbm, "cube:31") == tuple(range(248, 256))
    assert resolve_group(ahbm, "sip") == tuple(range(128))
    assert resolve_group(ahbm, "sip:1") == tuple(range(128, 256))
    assert resolve_group(torus6, "all") == tuple(range(48))
    assert resolve_group(torus6, "device:2") == tuple(range(16, 24))


def test_group_lists_and_ranges(ahbm):
    assert resolve_group(ahbm, "0-7,16") == (*range(8), 16)
    assert resolve_group(ahbm, "0-3,8-11") == (0, 1, 2, 3, 8, 9, 10, 11)
    assert resolve_group(ahbm, "0, 2, 4") == (0, 2, 4)
    assert resolve_group(ahbm, "7,3,5") == (7, 3, 5)           # member order is the order given
    assert resolve_group(ahbm, [5, 1, 200]) == (5, 1, 200)
    assert resolve_group(ahbm, range(250, 256)) == tuple(range(250, 256))
    assert resolve_group(ahbm, (0, 255)) == (0, 255)


def test_group_errors(ahbm, torus6):
    with pytest.raises(CollectiveError, match=r"unknown group 'foo'.*known: all, sip, cube"):
        resolve_group(ahbm, "foo")
    with pytest.raises(CollectiveError, match=r"unknown group 'cube'.*known: all, device"):
        resolve_group(torus6, "cube")
    with pytest.raises(CollectiveError, match=r"'cube' has instances 0..31"):
        resolve_group(ahbm, "cube:32")
    with pytest.raises(CollectiveError, match=r"'cube' has instances"):
        resolve_group(ahbm, "cube:x")
    with pytest.raises(CollectiveError, match=r"PE 256 is outside topology 'ahbm' \(PEs 0..255\)"):
        resolve_group(ahbm, "250-257")
    with pytest.raises(CollectiveError, match=r"PE 48 is outside topology 'torus6'"):
        resolve_group(torus6, [0, 48])
    with pytest.raises(CollectiveError, match="PE -1 is outside"):
        resolve_group(ahbm, [-1, 0])
    with pytest.raises(CollectiveError, match="names a PE twice"):
        resolve_group(ahbm, "0-3,2")
    with pytest.raises(CollectiveError, match="names a PE twice"):
        resolve_group(ahbm, [1, 1])
    for one in ("5", [5], "5-5"):
        with pytest.raises(CollectiveError, match="at least two members"):
            resolve_group(ahbm, one)
    with pytest.raises(CollectiveError, match=r"cannot read '0 - 3'"):
        resolve_group(ahbm, "0 - 3")


def test_group_reversed_range_is_an_error(ahbm):
    with pytest.raises(CollectiveError, match="runs backwards"):
        resolve_group(ahbm, "0-1,5-3")


def test_group_trailing_dash_is_an_error(ahbm):
    with pytest.raises(CollectiveError, match="cannot read"):
        resolve_group(ahbm, "0,1-")


# ---- grids --------------------------------------------------------------------------------

def test_cube_grid_rings_round_the_corner_routers(ahbm):
    grid = grid_of(ahbm, "cube")
    assert grid.order == [0, 1, 2, 3, 6, 7, 4, 5]
    assert grid.dims == (8,)
    assert grid_of(ahbm, "cube:3").order == [0, 1, 2, 3, 6, 7, 4, 5]


def test_whole_machine_grid(ahbm):
    grid = grid_of(ahbm, "all")
    assert grid.dims == (8, 4, 4, 2)
    assert grid.names == ("pe", "x", "y", "sip")
    assert sorted(grid.order) == list(range(256))
    assert grid.order[:8] == [0, 1, 2, 3, 6, 7, 4, 5]
    assert len(set(grid.coords)) == 256
    for j, size in enumerate(grid.dims):
        line = grid.line(77, j)
        assert len(line) == size and 77 in line
        assert all(grid.coords[m][:j] + grid.coords[m][j + 1:] == grid.coords[77][:j] + grid.coords[77][j + 1:]
                   for m in line)


def test_grids_of_other_groups(ahbm, torus6):
    assert grid_of(ahbm, "sip").dims == (8, 4, 4)
    two_cubes = grid_of(ahbm, "0-3,8-11")
    assert two_cubes.dims == (4, 2) and sorted(two_cubes.order) == list(range(8))
    assert grid_of(torus6, "all").dims == (8, 3, 2)
    across = grid_of(torus6, "0,8,16,24,32,40")
    assert across.dims == (3, 2) and sorted(across.order) == list(range(6))
    odd = grid_of(ahbm, "7,3,5")
    assert odd.pes == (7, 3, 5) and sorted(odd.order) == [0, 1, 2]


def test_hier_reduce_scatter_between_chips_is_the_all_gather_backwards():
    """Between chips (one PE per chip of tiny_system: tray and switch dimensions) ``hier``'s
    reduce-scatter sends each pair the all-gather's blocks the other way, so each link carries
    what it carries in the all-gather; the all-reduce is the two in turn."""
    from pathlib import Path
    system = load_machine(str(Path(__file__).resolve().parent / "data" / "tiny_system.toml"))
    grid = make_grid(system, tuple(next(p for p in range(len(system.pes)) if system.chip_of(p) == c)
                                   for c in range(system.chips)))
    assert grid.inner == 0 and len(grid.dims) == 2
    rs, ag, ar = (schedule(kind, "hier", grid) for kind in ("reduce_scatter", "all_gather", "all_reduce"))
    for sched in (rs, ag, ar):
        verify(sched)
    assert all(x.reduce for step in rs.steps for x in step)
    pairs = lambda sched, back: sorted((x.dst, x.src, x.blocks) if back else (x.src, x.dst, x.blocks)  # noqa: E731
                                       for step in sched.steps for x in step)
    assert pairs(rs, True) == pairs(ag, False)
    assert ar.steps == rs.steps + ag.steps
    shards = [torch.randn(4 * 6) for _ in range(4)]
    for got, want in zip(reference(rs, shards), torch_reference("reduce_scatter", shards)):
        torch.testing.assert_close(got, want)


def test_every_list_of_algorithms_is_derived_from_the_registry():
    """``ALGOS`` by rank, ``LINE_ALGOS``, the op families' ``algo`` choices and the command
    line's ``--algo`` choices: each the registry's (``@algorithm``), nothing listed by hand."""
    assert ALGOS == tuple(sorted(ALGORITHMS, key=lambda a: ALGORITHMS[a].rank))
    assert ALGOS[:6] == ("ring", "bidir-ring", "2d", "direct", "tree", "hier")     # the shipped ones first
    assert LINE_ALGOS == tuple(a for a in ALGOS if ALGORITHMS[a].lines)
    assert LINE_ALGOS[:3] == ("ring", "bidir-ring", "tree")
    assert COLLECTIVE_ALGOS == (*ALGOS, "auto")
    for kind in KINDS:
        assert {p.name: p for p in family(kind).params}["algo"].choices == ("auto", *ALGOS)


def test_an_algorithm_registered_twice_is_refused():
    with pytest.raises(ValueError, match="'ring' or rank 99 is registered twice"):
        algorithm("ring", rank=99)(lambda kind, grid, root: None)
    with pytest.raises(ValueError, match="'new' or rank 0 is registered twice"):
        algorithm("new", rank=0)(lambda kind, grid, root: None)
    assert "new" not in ALGORITHMS
