"""Meshes over the chips of a composed system (chips x PEs), for the parallel styles across
chips (``expert_parallel``, ``pipeline``).

A chip mesh is the ``kbtorch.init_device_mesh`` mesh ``("chip", "pe")``, or its first rows:
row ``c`` holds the PEs of chip ``c`` (PEs are numbered chip-major, ``Machine.chip_of``), so
``mesh.shape == (chips, PEs per chip)``. ``chip_rows`` checks that a mesh is one: every row
inside one chip, no chip twice.
"""
from __future__ import annotations

from ..topology import as_machine
from .mesh import init_device_mesh
from .placement import Mesh


def chips_of(machine) -> list[tuple]:
    """The PE ids of every chip of ``machine``, chip by chip (one entry for a single chip)."""
    mesh = init_device_mesh(machine=machine)
    width = mesh.shape[1]
    return [tuple(mesh.pes[c * width:(c + 1) * width]) for c in range(mesh.shape[0])]


def chip_mesh(machine=None, chips: int | None = None) -> Mesh:
    """The (chips x PEs) mesh of the first ``chips`` chips of ``machine`` (default: all of
    them, ``init_device_mesh()``)."""
    machine = as_machine(machine)
    full = init_device_mesh(machine=machine)
    n = full.shape[0] if chips is None else chips
    if not 1 <= n <= full.shape[0]:
        raise ValueError(f"chip_mesh: {chips} chips asked of topology '{machine.name}', which has {full.shape[0]}")
    return Mesh(full.pes[:n * full.shape[1]], (n, full.shape[1]), machine, full.names)


def chip_rows(mesh: Mesh, what: str) -> list[tuple]:
    """The rows of a chip mesh (each one chip's PEs); ValueError naming ``what`` if ``mesh``
    is not 2-D or a row is not inside one chip or two rows share a chip."""
    if not isinstance(mesh, Mesh) or len(mesh.shape) != 2:
        raise ValueError(f"{what}: needs a 2-D mesh of (chips x PEs) (kbtorch.chip_mesh), got {mesh!r}")
    rows, seen = [], set()
    width = mesh.shape[1]
    for r in range(mesh.shape[0]):
        row = tuple(mesh.pes[r * width:(r + 1) * width])
        chips = {mesh.machine.chip_of(p) for p in row}
        if len(chips) != 1 or chips & seen:
            raise ValueError(f"{what}: mesh row {r} (PEs {list(row)}) is not the PEs of one chip of its own on "
                             f"topology '{mesh.machine.name}'")
        seen |= chips
        rows.append(row)
    return rows
