"""Meshes over the chips of a composed system (chips x PEs), for the parallel styles across
chips (``expert_parallel``, ``pipeline``).

A chip mesh is a 2-D ``Mesh`` whose rows are chips: row ``c`` holds the PEs of chip ``c``
(in PE-id order), so ``mesh.shape == (chips, PEs per chip)``. ``chip_rows`` checks that a
mesh is one: every row inside one chip, no chip twice.
"""
from __future__ import annotations

from ..ops.collective_group import level_instances, levels_of
from ..topology import as_machine
from .placement import Mesh


def chips_of(machine) -> list[tuple]:
    """The PE ids of every chip of ``machine``, chip by chip (one entry for a single chip)."""
    machine = as_machine(machine)
    if "chip" not in levels_of(machine):
        return [tuple(range(len(machine.pes)))]
    return [tuple(pes) for pes in level_instances(machine, "chip").values()]


def chip_mesh(machine=None, chips: int | None = None) -> Mesh:
    """The (chips x PEs) mesh of the first ``chips`` chips of ``machine`` (default: all)."""
    machine = as_machine(machine)
    found = chips_of(machine)
    n = len(found) if chips is None else chips
    if not 1 <= n <= len(found):
        raise ValueError(f"chip_mesh: {chips} chips asked of topology '{machine.name}', which has {len(found)}")
    if len({len(c) for c in found[:n]}) != 1:
        raise ValueError(f"chip_mesh: the chips of topology '{machine.name}' have different PE counts")
    return Mesh(tuple(p for c in found[:n] for p in c), (n, len(found[0])), machine)


def chip_rows(mesh: Mesh, what: str) -> list[tuple]:
    """The rows of a chip mesh (each one chip's PEs); ValueError naming ``what`` if ``mesh``
    is not 2-D or a row is not inside one chip or two rows share a chip."""
    if not isinstance(mesh, Mesh) or len(mesh.shape) != 2:
        raise ValueError(f"{what}: needs a 2-D mesh of (chips x PEs) (kbtorch.chip_mesh), got {mesh!r}")
    owner = {p: c for c, pes in enumerate(chips_of(mesh.machine)) for p in pes}
    rows, seen = [], set()
    width = mesh.shape[1]
    for r in range(mesh.shape[0]):
        row = tuple(mesh.pes[r * width:(r + 1) * width])
        chips = {owner[p] for p in row}
        if len(chips) != 1 or chips & seen:
            raise ValueError(f"{what}: mesh row {r} (PEs {list(row)}) is not the PEs of one chip of its own on "
                             f"topology '{mesh.machine.name}'")
        seen |= chips
        rows.append(row)
    return rows
