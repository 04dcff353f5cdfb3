"""Lines of a collective across chips: a line's programs renamed to another line's PEs are
the programs a build of that line gives (kbtorch/ops/collective/rename.py)."""
from pathlib import Path

import pytest

import kbtorch.ops.collective.build as build_module
from kbtorch.ops.collective import Request, rename, units
from kbtorch.ops.collective.build import build, build_lines
from kbtorch.ops.collective.groups import make_grid
from kbtorch.topology import load_machine
from kbtorch.topology.load.pipeline import resolve_doc
from kbtorch.topology.machine import Machine

SYSTEM = str(Path(__file__).resolve().parent / "data" / "tiny_system.toml")


def _lines(m, k):
    found = units.units(m, "chip", k)
    return [tuple(u[t] for u in found) for t in range(k)]


@pytest.mark.parametrize("name,k,kind,algo,nbytes", [
    (SYSTEM, 4, "all_reduce", "bidir-ring", 64 * 1024), (SYSTEM, 2, "all_gather", "direct", 4 * 8192),
    (SYSTEM, 4, "reduce_scatter", "ring", 4 * 16384), ("maia200_x8", 4, "all_reduce", "bidir-ring", 2**20),
    ("maia200_x8", 2, "all_reduce", "tree", 2**20), ("maia200_x8", 4, "all_gather", "direct", 8 * 2**16),
    ("maia200_x8", 2, "all_reduce", "hier", 2**22)])
def test_renamed_line_equals_its_build(name, k, kind, algo, nbytes):
    m = load_machine(name)
    lines = _lines(m, k)
    req = Request(kind, m, algo=algo, nbytes=nbytes, dtype="bf16")
    built = [build(req, make_grid(m, ln)).programs for ln in lines]
    for t in range(1, k):
        got = rename.programs(m, built[0], make_grid(m, lines[0]), make_grid(m, lines[t]))
        assert got is not None and got == built[t]
        assert got != built[0]


def test_build_of_every_line_renames_and_matches_the_full_build(monkeypatch):
    m = load_machine("maia200_x8")
    lines, sizes = _lines(m, 4), [2**18] * 4
    req = Request("all_reduce", m, algo="bidir-ring", dtype="bf16")
    fast = build_lines(req, lines, sizes)
    calls = []
    monkeypatch.setattr(build_module, "build", lambda r, grid: calls.append(grid.pes) or build(r, grid))
    assert build_lines(req, lines, sizes).programs == fast.programs
    assert len(calls) == 1


def test_lines_on_different_hardware_or_memories_are_built():
    m = load_machine(SYSTEM)
    a, b = _lines(m, 2)
    progs = build(Request("all_reduce", m, algo="ring", nbytes=4096, dtype="bf16"), make_grid(m, a)).programs
    ga, gb = make_grid(m, a), make_grid(m, b)
    assert rename.programs(m, progs, ga, gb) is not None
    assert rename.programs(m, progs, ga, gb, multicast=True) is None
    assert rename.programs(m, progs, ga, make_grid(m, b[::-1])) is None       # another ring order
    assert rename.programs(m, progs, ga, make_grid(m, b[:-1])) is None
    slow = Machine(SYSTEM, doc=resolve_doc(SYSTEM))
    slow.digest += "+slow-pe"       # NOTE: machines are equal (and cached) by content: this one differs
    for u, v, d in slow.graph.edges(data=True):
        if u.startswith(slow.pes[b[2]].prefix) and d["kind"] == "tcm":
            d["flit_ps"] *= 2
    assert rename.programs(slow, progs, make_grid(slow, a), make_grid(slow, b)) is None    # a PE differs


def test_multicast_groupings_decide_whether_a_line_is_renamed():
    m = load_machine("maia200_x8")
    lines = _lines(m, 4)
    kernel = build(Request("all_gather", m, algo="direct", nbytes=8 * 2**16, dtype="bf16"),
                   make_grid(m, lines[0])).kernels[0]
    assert kernel.multicast and kernel.tree_log
    assert kernel.multicasts_alike(lines[1])
    flipped = {(s, ds, not ok) for s, ds, ok in kernel.tree_log}
    kernel.tree_log = flipped
    assert not kernel.multicasts_alike(lines[1])
