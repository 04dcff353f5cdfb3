"""Collectives on the simulator: numerics against torch, the models beside the simulated time,
algorithm trade-offs, auto selection, determinism and the errors of bad input (side by side:
``test_collective_concurrent.py``)."""
import json
from dataclasses import replace
import zlib

import pytest
import torch

from kbtorch.kernel import policy
import kbtorch.ops.collective.choice as choice_module
from kbtorch.ops.collective import ALGOS, BUS_FACTOR, KINDS, CollectiveError, Request, collective, torch_reference
from kbtorch.ops.collective.groups import make_grid, resolve_group
from kbtorch.ops.collective.schedules import schedule
from kbtorch.topology import load_machine

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
#: (rtol, atol) of a reduction over <= 8 members of randn values, by dtype.
TOL = {torch.float16: (1e-2, 5e-2), torch.bfloat16: (5e-2, 3e-1), torch.float32: (1e-5, 1e-5)}


@pytest.fixture(scope="module")
def torus6():
    return load_machine("torus6")


@pytest.fixture(scope="module")
def ahbm_torus():
    return load_machine("ahbm_torus")


def check_run(run, kind=None, members=None, bound=True):
    """What every simulated collective must satisfy (``bound=False``: all but the lower bound,
    see ``test_bound_is_a_lower_bound_on_uneven_rings``)."""
    n = len(run.pes)
    if kind is not None:
        assert run.kind == kind
    if members is not None:
        assert n == members
    assert run.latency_ns > 0
    assert run.pct_bound > 0
    assert not bound or run.pct_bound <= 100.5, f"bound {run.bound_ps} ps is not a lower bound of {run.result.latency_ps} ps"
    assert run.bound_ps >= run.startup_ps > 0
    assert run.analytic_ps > 0
    assert run.algbw_gbps == pytest.approx(run.nbytes / run.latency_ns)
    assert run.busbw_gbps == pytest.approx(run.algbw_gbps * BUS_FACTOR[run.kind](n))
    d = run.as_dict()
    json.dumps(d)
    assert d["latency_ns"] == run.latency_ns and d["members"] == n and d["algo"] == run.algo


def test_bus_factors():
    assert BUS_FACTOR["all_reduce"](8) == pytest.approx(1.75)
    assert BUS_FACTOR["reduce_scatter"](8) == pytest.approx(0.875)
    assert BUS_FACTOR["all_gather"](4) == pytest.approx(0.75)
    assert BUS_FACTOR["broadcast"](8) == 1.0
    assert BUS_FACTOR["all_to_all"](8) == pytest.approx(0.875)


def make_shards(kind, n, numel, dtype, seed):
    """One tensor per member; an all-gather member holds its 1/n share of ``numel``."""
    g = torch.Generator().manual_seed(seed)
    per = numel // n if kind == "all_gather" else numel
    return [torch.randn(per, generator=g).to(dtype) for _ in range(n)]


def assert_outputs(run, kind, shards, op, root):
    want = torch_reference(kind, shards, op, root)
    assert run.outputs is not None and len(run.outputs) == len(shards)
    rtol, atol = TOL[shards[0].dtype]
    for m, (got, exp) in enumerate(zip(run.outputs, want)):
        assert got.dtype == shards[0].dtype and got.shape == exp.shape, (kind, m)
        if op == "max" or kind in ("all_gather", "broadcast", "all_to_all"):
            assert torch.equal(got, exp), (kind, m)
        else:
            torch.testing.assert_close(got, exp, rtol=rtol, atol=atol, msg=f"{kind} member {m}")


def run_numerics(machine, group, n, numel, kind, algo, dtype, op, root):
    shards = make_shards(kind, n, numel, DTYPES[dtype], seed=zlib.crc32(f"{kind} {algo} {dtype} {op}".encode()))
    if algo == "tree" and kind in ("reduce_scatter", "all_gather") and n & (n - 1):
        with pytest.raises(CollectiveError, match="power-of-two"):
            collective(kind, shards, group=group, algo=algo, op=op, root=root, machine=machine)
        return
    if kind == "all_to_all" and algo in ("tree", "bidir-ring"):
        with pytest.raises(CollectiveError, match="does not apply to all_to_all"):
            collective(kind, shards, group=group, algo=algo, op=op, root=root, machine=machine)
        return
    run = collective(kind, shards, group=group, algo=algo, op=op, root=root, machine=machine)
    assert (run.algo, run.dtype, run.reduction) == (algo, dtype, op)
    eb = shards[0].element_size()
    assert run.nbytes == numel * eb
    check_run(run, kind, n)
    assert_outputs(run, kind, shards, op, root)


# ---- numerics -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f16", "fp32"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kind,op", [(k, "sum") for k in KINDS] + [("all_reduce", "max")])
def test_numerics_cube(ahbm, kind, op, algo, dtype):
    run_numerics(ahbm, "cube", 8, 256, kind, algo, dtype, op, root=5)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kind,op", [(k, "sum") for k in KINDS] + [("all_reduce", "max")])
def test_numerics_across_torus6_devices(torus6, kind, op, algo):
    run_numerics(torus6, "0,8,16,24,32,40", 6, 240, kind, algo, "f16", op, root=3)


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kind,op", [(k, "sum") for k in KINDS] + [("all_reduce", "max")])
def test_numerics_ahbm_torus_two_cubes(ahbm_torus, kind, op, algo):
    run_numerics(ahbm_torus, "0-3,8-11", 8, 256, kind, algo, "f16", op, root=6)


@pytest.mark.parametrize("kind", KINDS)
def test_numerics_bf16_and_2d_shards(ahbm, kind):
    g = torch.Generator().manual_seed(1)
    shape = (2, 8) if kind == "all_gather" else (4, 32)
    shards = [torch.randn(*shape, generator=g).to(torch.bfloat16) for _ in range(8)]
    run = collective(kind, shards, group="cube", algo="ring", root=2, machine=ahbm)
    assert run.dtype == "bf16"
    check_run(run, kind, 8)
    assert_outputs(run, kind, shards, "sum", 2)


def test_timing_only_run_has_no_outputs(ahbm):
    run = collective("all_gather", group="cube:3", nbytes=8 << 10, algo="ring", dtype="fp32", machine=ahbm)
    assert run.outputs is None and run.pes == tuple(range(24, 32))
    check_run(run, "all_gather", 8)


# ---- concurrency --------------------------------------------------------------------------

# ---- algorithm trade-offs -----------------------------------------------------------------

# Direct does not beat ring on the CUBE at any small size (1-32 KiB: ring is 1.03-1.32x
# faster): each member issues one command per peer and reduces the 7 arrivals with one
# composite each, so the kernel is issue-bound and the single step saves little. It does win
# where hops are long: one PE of each of four CUBEs (16 KiB: direct 493.5 ns, ring 617.6;
# 1 MiB: ring 12.4 us, direct 17.7), four PEs spread over the AHBM torus (4 KiB: direct
# 511.2 ns, ring 660.0; 1 MiB: ring 12.5 us, direct 17.8).
@pytest.mark.parametrize("topo,group,small,large", [
    ("ahbm", "0,8,16,24", 16 << 10, 1 << 20),
    ("ahbm_torus", "0,128,64,192", 4 << 10, 1 << 20),
])
def test_direct_wins_small_ring_wins_large(request, topo, group, small, large):
    machine = request.getfixturevalue(topo)

    def lat(nbytes, algo):
        run = collective("all_reduce", group=group, nbytes=nbytes, algo=algo, machine=machine)
        check_run(run, "all_reduce", 4)
        return run.latency_ns

    assert lat(small, "direct") < lat(small, "ring")
    assert lat(large, "ring") < lat(large, "direct")


@pytest.mark.parametrize("nbytes", [1 << 10, 4 << 20])
def test_auto_is_close_to_the_best_algorithm(ahbm, nbytes):
    """Measured (ns): 1 KiB: auto -> tree 208.5, the best (ring 653.5, direct 863.5);
    4 MiB: auto -> ring 63661, best bidir-ring 61825 (1.03x)."""
    auto = collective("all_reduce", group="cube", nbytes=nbytes, algo="auto", machine=ahbm)
    check_run(auto, "all_reduce", 8)
    assert set(auto.candidates) == set(ALGOS)
    assert auto.algo == min(auto.candidates, key=auto.candidates.get)
    grid = make_grid(ahbm, auto.pes)
    plan = lambda algo: (schedule("all_reduce", algo, grid).blocks, schedule("all_reduce", algo, grid).steps)  # noqa: E731
    simulated, seen = {auto.algo: auto.latency_ns}, {plan(auto.algo): auto.algo}
    for algo in ALGOS:
        if algo in simulated:
            continue
        if plan(algo) in seen:      # the same schedule simulates the same (2d on a one-dimensional grid is ring)
            simulated[algo] = simulated[seen[plan(algo)]]
            continue
        run = collective("all_reduce", group="cube", nbytes=nbytes, algo=algo, machine=ahbm)
        check_run(run, "all_reduce", 8)
        simulated[algo], seen[plan(algo)] = run.latency_ns, algo
    assert auto.latency_ns <= 1.5 * min(simulated.values()), (auto.algo, simulated)


def test_auto_skips_algorithms_that_do_not_apply(ahbm):
    # 6 members: no recursive halving; 1000 bytes f16 (500 elements) in equal shares of 8
    # members split into the one block per member of ring, 2d, direct and hier, not the 8
    # blocks per member of bidir-ring and recursive halving
    run = collective("all_gather", group="0-5", nbytes=6 << 10, machine=ahbm)
    assert "tree" not in run.candidates and run.algo in run.candidates
    check_run(run, "all_gather", 6)
    odd = collective("reduce_scatter", group="cube", nbytes=1008, machine=ahbm)
    assert "bidir-ring" not in odd.candidates and odd.algo in odd.candidates


@pytest.mark.parametrize("group, numel, kind, op", [("cube", 500, "all_reduce", "sum"), ("0-5", 1024, "all_reduce", "max"),
                                                   ("0-5", 2048, "broadcast", "sum"), ("cube", 333, "all_reduce", "sum")])
def test_any_element_count_reduces_and_broadcasts(ahbm, group, numel, kind, op):
    n = len(resolve_group(ahbm, group))
    shards = [torch.randn(numel, dtype=torch.float16, generator=torch.Generator().manual_seed(i)) for i in range(n)]
    for algo in ("ring", "tree", "direct"):
        run = collective(kind, shards, group=group, algo=algo, op=op, root=n - 1, machine=ahbm)
        ref = torch_reference(kind, shards, op, n - 1)
        assert run.nbytes == numel * 2 and all(o.shape == r.shape for o, r in zip(run.outputs, ref))
        assert all(torch.allclose(o.float(), r.float(), atol=0.05) for o, r in zip(run.outputs, ref)), algo
        assert run.latency_ps >= run.bound_ps


def test_bound_is_a_lower_bound_on_uneven_rings(ahbm):
    # ring order 0 -> 64 -> 192 -> 128 -> 0: hop alphas 37.0, 116.3, 37.0, 150.3 ns; the
    # startup bound follows each block's own chain, not the worst hop of every step
    run = collective("all_reduce", group="0,128,64,192", nbytes=1 << 10, algo="ring", machine=ahbm)
    assert run.bound_ps <= run.result.latency_ps, (run.bound_ps, run.result.latency_ps, run.bottleneck)


@pytest.mark.parametrize("algo", ["ring", "2d", "hier"])
def test_startup_bound_counts_the_commands_the_kernel_issues(tiny, algo):
    """A copy of a value its sender made with its own composite rides in that composite
    (fused copy): 4 PEs of the tiny machine, 1 KiB all-reduce. The startup bound counted a
    command for it and stood 10-14% above the simulated ``2d`` and ``hier``."""
    run = collective("all_reduce", group="0-3", nbytes=1 << 10, algo=algo, machine=tiny)
    issued = max(len(cmds) for cmds in run.result.programs.values())
    launch = min(tiny.launch_ps(pe) for pe in run.pes)
    floor = tiny.control_ps(run.pes[0]) + launch + issued * tiny.issue.kind_ps("dma")
    assert floor <= run.startup_ps <= run.bound_ps <= run.result.latency_ps


# ---- determinism --------------------------------------------------------------------------

def test_same_collective_twice_is_identical(ahbm):
    args = dict(group="0-3,8-11", nbytes=64 << 10, algo="2d", machine=ahbm)
    a = collective("reduce_scatter", **args)
    b = collective("reduce_scatter", **args)
    assert a.result.latency_ps == b.result.latency_ps
    assert a.result.events == b.result.events
    assert a.result.pe_finish_ps == b.result.pe_finish_ps
    assert (a.bound_ps, a.analytic_ps, a.bottleneck) == (b.bound_ps, b.analytic_ps, b.bottleneck)


# ---- errors -------------------------------------------------------------------------------

def _ones(n=8, numel=64, dtype=torch.float16):
    return [torch.ones(numel, dtype=dtype) for _ in range(n)]


BAD = {
    "group of one": (dict(kind="all_reduce", group="5", nbytes=1024), "at least two members"),
    "group of one (list)": (dict(kind="all_reduce", group=[5], nbytes=1024), "at least two members"),
    "shapes differ": (dict(kind="all_reduce", shards=_ones(7) + [torch.ones(32, dtype=torch.float16)]),
                      r"shard 7 is \(32,\).*shard 0 is \(64,\).*must match"),
    "dtypes differ": (dict(kind="all_reduce", shards=_ones(7) + [torch.ones(64)]),
                      r"shard 7 is \(64,\) torch.float32.*must match"),
    "too few shards": (dict(kind="all_reduce", shards=_ones(7)), "7 shards for a group of 8 members"),
    "too many shards": (dict(kind="all_gather", shards=_ones(9)), "9 shards for a group of 8 members"),
    "unsupported dtype": (dict(kind="all_reduce", shards=_ones(dtype=torch.int32)), "not supported"),
    "PE outside": (dict(kind="all_reduce", group="250-257", nbytes=1024),
                   r"PE 256 is outside topology 'ahbm' \(PEs 0..255\)"),
    "payload not in blocks": (dict(kind="reduce_scatter", nbytes=1000, algo="ring"),
                              r"1000 bytes per member \(500 elements of 2 bytes\) do not split into 8 equal blocks"),
    "shards not in blocks": (dict(kind="reduce_scatter", shards=_ones(numel=504), algo="bidir-ring"),
                             "do not split into 16 equal blocks"),
    "unknown algo": (dict(kind="all_reduce", nbytes=1024, algo="butterfly"), r"unknown algorithm 'butterfly'"),
    "unknown op": (dict(kind="all_reduce", nbytes=1024, op="min"), r"unknown reduction 'min' \(known: sum, max\)"),
    "unknown kind": (dict(kind="all_to_some", nbytes=1024), r"unknown collective .all_to_some."),
    "unknown dtype": (dict(kind="all_reduce", nbytes=1024, dtype="int8"), r"unknown dtype 'int8'"),
    "no payload": (dict(kind="all_reduce"), "nbytes > 0"),
    "root outside": (dict(kind="broadcast", nbytes=1024, root=8), r"root 8 is not a member rank \(0..7\)"),
    "negative root": (dict(kind="broadcast", nbytes=1024, root=-1), r"root -1 is not a member rank"),
    "tree halving non power of two": (dict(kind="reduce_scatter", group="0-5", nbytes=6 << 10, algo="tree"),
                                      "power-of-two"),
    "HBM too small": (dict(kind="all_reduce", nbytes=1 << 40, algo="ring"), "HBM"),
    "packet too big for TCM (7 channels)": (dict(kind="all_reduce", nbytes=8 << 20, algo="direct",
                                                 packet_bytes=4 << 20),
                                            r"packet_bytes=4194304: 7 receive channels x 9 slots do not fit the TCM"),
    "packet too big for TCM (1 channel)": (dict(kind="all_reduce", nbytes=64 << 10, algo="ring",
                                                packet_bytes=64 << 20), r"packet_bytes=67108864.*TCM"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_a_collective_error(ahbm, case):
    kw, match = BAD[case]
    kw = {"group": "cube", **kw}
    kind = kw.pop("kind")
    shards = kw.pop("shards", None)
    with pytest.raises(CollectiveError, match=match):
        collective(kind, shards, machine=ahbm, **kw)


def test_packet_bytes_within_the_tcm_is_accepted(ahbm):
    run = collective("all_reduce", group="cube", nbytes=256 << 10, algo="ring", packet_bytes=8 << 10, machine=ahbm)
    check_run(run, "all_reduce", 8)


def test_grid_order_reduce_scatter_keeps_the_chunk_of_each_members_rank(ahbm):
    """``order="grid"``: member i ends with the chunk of its rank in the grid's coordinate
    order; a 2d reduce-scatter then moves consecutive blocks, fewer packets than rank order."""
    grid = make_grid(ahbm, resolve_group(ahbm, "0-3,8-11"))
    rank = sorted(range(8), key=lambda m: grid.coords[m])
    shards = [torch.randn(64, generator=torch.Generator().manual_seed(m)) for m in range(8)]
    run = collective("reduce_scatter", shards, group="0-3,8-11", algo="2d", order="grid", machine=ahbm)
    check_run(run, "reduce_scatter", 8)
    want = torch_reference("reduce_scatter", shards)
    for i, m in enumerate(rank):
        torch.testing.assert_close(run.outputs[m], want[i])
    with pytest.raises(CollectiveError, match="unknown block order"):
        collective("reduce_scatter", shards, group="0-3,8-11", order="mesh", machine=ahbm)


def test_auto_mode_runs_coarse_above_the_kernels_command_count(ahbm, monkeypatch):
    """``mode="auto"``: coarse above ``COARSE_COMMANDS`` commands (here lowered to 0, so any
    kernel is above it); an explicit mode is kept."""
    kw = dict(group="cube", nbytes=4 << 10, algo="ring", machine=ahbm)
    assert collective("all_reduce", **kw).mode == "fast"
    monkeypatch.setattr(policy, "COARSE_COMMANDS", 0)
    assert collective("all_reduce", **kw).mode == "coarse"
    assert collective("all_reduce", mode="fast", **kw).mode == "fast"


def test_auto_mode_runs_coarse_above_the_kernels_flit_crossings(ahbm, monkeypatch):
    """``mode="auto"``: coarse above ``COARSE_FLIT_HOPS`` link crossings of the kernel's
    traffic (a 4 KiB ring over a CUBE crosses about a thousand)."""
    kw = dict(group="cube", nbytes=4 << 10, algo="ring", machine=ahbm)
    monkeypatch.setattr(policy, "COARSE_FLIT_HOPS", 10_000)
    assert collective("all_reduce", **kw).mode == "fast"
    monkeypatch.setattr(policy, "COARSE_FLIT_HOPS", 10)
    assert collective("all_reduce", **kw).mode == "coarse"


# ---- the whole machine --------------------------------------------------------------------

def test_tree_all_reduce_over_the_whole_machine(ahbm):
    """256 members. NOTE: in the default (fast) mode this one run takes ~20 s of wall time
    (1.5 M network events); coarse mode keeps it to a few seconds."""
    run = collective("all_reduce", group="all", nbytes=64 << 10, algo="tree", machine=ahbm, mode="coarse")
    check_run(run, "all_reduce", 256)
    assert run.mode == "coarse" and run.pes == tuple(range(256))


def test_hierarchical_all_reduce_beats_recursive_doubling_on_the_whole_machine(ahbm):
    """Measured (ns): 7 KiB over 256 PEs: hier 917.2, tree 3260.0 (every CUBE's 8 PEs send
    their whole buffer over the same links between CUBEs in tree; hier sends an eighth)."""
    hier = collective("all_reduce", group="all", nbytes=7 << 10, algo="hier", machine=ahbm)
    tree = collective("all_reduce", group="all", nbytes=7 << 10, algo="tree", machine=ahbm)
    check_run(hier, "all_reduce", 256)
    assert hier.mode == "fast" and hier.latency_ns < 0.5 * tree.latency_ns
    assert collective("all_reduce", group="all", nbytes=7 << 10, machine=ahbm).algo == "hier"


def test_auto_does_not_build_an_algorithm_whose_schedule_an_earlier_one_has(monkeypatch):
    """Inside one chip hier's schedule is 2d's: built once, 2d's bound stands for both, and
    the choice goes on to the next algorithm."""
    m = load_machine("maia200")
    grid = make_grid(m, list(range(36)))
    assert schedule("reduce_scatter", "hier", grid) == replace(schedule("reduce_scatter", "2d", grid), algo="hier")
    built = []
    real = choice_module.build
    monkeypatch.setattr(choice_module, "build", lambda req, grid: built.append(req.algo) or real(req, grid))
    cands = {"2d": 0, "hier": 1, "ring": 2}                 # estimates (ps) far below every bound
    monkeypatch.setattr(choice_module, "estimates", lambda req, grid: cands)
    got = choice_module.choose(Request("reduce_scatter", m, nbytes=36 * 8192, dtype="bf16"), [grid.pes])
    assert built == ["2d", "ring"] and got.algo in built and got.candidates == cands
