"""Collectives across the chips of a system (group "across:chip", kbtorch/ops/collective/units.py),
the hierarchical all-reduce inside chips then across them, and all-to-all: numerics vs torch."""
from pathlib import Path

import pytest
import torch

from kbtorch.cli import main
from kbtorch.ops.collective import CollectiveError, Request, all_to_all, collective, estimates, torch_reference
from kbtorch.ops.collective.groups import make_grid, resolve_group
from kbtorch.ops.collective.schedules import schedule, verify
from kbtorch.topology import load_machine

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def system():
    return load_machine(str(DATA / "tiny_system.toml"))


def _same(run, shards, kind, root=0):
    ref = torch_reference(kind, shards, root=root)
    return len(run.outputs) == len(ref) and all(
        o.shape == r.shape and torch.allclose(o, r, atol=1e-5) for o, r in zip(run.outputs, ref))


# kind, elements per chip (uneven shares over the 4 PEs of a chip on purpose)
ACROSS = [("all_gather", 20), ("all_reduce", 37), ("reduce_scatter", 36), ("all_to_all", 44), ("broadcast", 21)]


@pytest.mark.parametrize("kind,numel", ACROSS)
@pytest.mark.parametrize("algo", ["auto", "ring", "direct", "hier"])
def test_across_chips_matches_torch(system, kind, numel, algo):
    gen = torch.Generator().manual_seed(numel)
    shards = [torch.randn(numel, generator=gen) for _ in range(system.chips)]
    run = collective(kind, shards, group="across:chip", algo=algo, machine=system, root=1)
    assert run.members == 4 and len(run.pes) == 16 and run.busbw_gbps > 0
    assert _same(run, shards, kind, root=1)
    assert run.pct_bound and run.pct_bound > 20


def test_across_needs_a_level(system):
    with pytest.raises(CollectiveError, match="unknown level"):
        collective("all_gather", group="across:rack", nbytes=1024, machine=system)


def test_hier_all_reduce_runs_inside_chips_then_across(system):
    grid = make_grid(system, resolve_group(system, "all"))
    assert grid.inner == 2                                   # pe and x inside the chip; chip, tray across
    sched = schedule("all_reduce", "hier", grid)
    verify(sched)
    chip = [system.chip_of(grid.pes[m]) for m in range(16)]
    first = sched.steps[0]
    assert all(chip[x.src] == chip[x.dst] for x in first)    # phase 1 stays inside each chip
    shards = [torch.randn(48) for _ in range(16)]
    run = collective("all_reduce", shards, algo="hier", machine=system)
    assert _same(run, shards, "all_reduce")


@pytest.mark.parametrize("algo", ["direct", "ring", "2d", "hier"])
def test_all_to_all_matches_torch(algo):
    machine = load_machine(str(DATA / "tiny.toml"))
    shards = [torch.arange(8 * 3, dtype=torch.float32) + 100 * i for i in range(8)]
    run = all_to_all(shards, algo=algo, machine=machine)
    assert _same(run, shards, "all_to_all")
    assert run.bound_ps > 0 and run.analytic_ps > 0


def test_all_to_all_auto_and_refusals():
    machine = load_machine(str(DATA / "tiny.toml"))
    grid = make_grid(machine, resolve_group(machine, "all"))
    est = estimates(Request("all_to_all", machine, nbytes=8 * 1024), grid)
    assert set(est) == {"ring", "2d", "direct", "hier"}
    run = all_to_all(nbytes=8 * 1024, machine=machine)
    assert run.algo == min(est, key=est.get) or run.algo in est
    with pytest.raises(CollectiveError, match="tree' does not apply"):
        all_to_all(nbytes=8 * 1024, algo="tree", machine=machine)
    with pytest.raises(CollectiveError, match="equal blocks"):
        all_to_all(nbytes=8 * 2 + 2, algo="direct", machine=machine)


def test_bench_alltoall_cli(capsys):
    assert main(["bench", "alltoall", "--bytes", "16KiB", "--topology", str(DATA / "tiny_system.toml"),
                 "--group", "chip:1", "--check"]) == 0
    out = capsys.readouterr().out
    assert "all_to_all" in out and "allclose yes" in out
    assert main(["bench", "allgather", "--bytes", "8KiB", "--topology", str(DATA / "tiny_system.toml"),
                 "--group", "across:chip:2", "--check"]) == 0
    out = capsys.readouterr().out
    assert "4 (group across:chip:2)" in out and "allclose yes" in out


@pytest.fixture(scope="module")
def sprayed():
    """tiny_system with adaptive port spraying (maia200_x8's policy)."""
    return load_machine(str(DATA / "tiny_system.toml"), overrides={"routing.policy": "port-spray",
                                                                    "routing.adaptive": True})


def _network_load(machine, run) -> float:
    """The busiest chip-to-chip link's load (ps) of a run's programs (the bound's model)."""
    from kbtorch.sim.resources import resource_ps
    busy = resource_ps(machine, run.result.programs)
    return max(v for k, v in busy.items() if isinstance(k, tuple) and machine.graph.edges[k]["kind"].startswith("eth"))


def test_sprayed_hier_reduce_scatter_loads_the_network_as_the_all_gather(sprayed):
    """Same per-chip blocks: ``hier``'s reduce-scatter between chips (the all-gather backwards)
    loads the busiest link as the all-gather does, the all-reduce as both; the pipelined,
    paced kernel of several rounds runs to the end (more than half of its bound)."""
    block = 1 << 20
    runs = {kind: collective(kind, group="across:chip", algo="hier", machine=sprayed, nbytes=n, dtype="f16")
            for kind, n in (("all_gather", 4 * block), ("reduce_scatter", 4 * block), ("all_reduce", 4 * block))}
    ag, rs, ar = (_network_load(sprayed, runs[k]) for k in ("all_gather", "reduce_scatter", "all_reduce"))
    assert rs == pytest.approx(ag, rel=0.02) and ar == pytest.approx(ag + rs, rel=0.02)
    assert all(r.pct_bound > 50 for r in runs.values()), {k: r.pct_bound for k, r in runs.items()}


@pytest.mark.parametrize("kind,numel", [("reduce_scatter", 4 * 1536), ("all_reduce", 6000)])
def test_sprayed_hier_numerics_equal_torch_and_single_path(system, sprayed, kind, numel):
    gen = torch.Generator().manual_seed(numel)
    shards = [torch.randn(numel, generator=gen) for _ in range(4)]
    runs = [collective(kind, [s.clone() for s in shards], group="across:chip", algo="hier", machine=m)
            for m in (system, sprayed)]
    for run in runs:
        assert _same(run, shards, kind)
    assert all(torch.equal(a, b) for a, b in zip(runs[0].outputs, runs[1].outputs))
