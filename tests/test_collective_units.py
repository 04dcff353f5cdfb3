"""Collectives across the chips of a system (group "across:chip", kbtorch/ops/collective_units.py),
the hierarchical all-reduce inside chips then across them, and all-to-all: numerics vs torch."""
from pathlib import Path

import pytest
import torch

from kbtorch.cli import main
from kbtorch.ops.collective import all_to_all, collective, estimates, torch_reference
from kbtorch.ops.collective_group import make_grid, resolve_group
from kbtorch.ops.collective_plan import CollectiveError, schedule, verify
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
    est = estimates("all_to_all", machine, grid, 8 * 1024, 2)
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
