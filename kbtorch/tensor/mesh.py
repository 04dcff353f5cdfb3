"""Device meshes over a machine's hierarchy, in the manner of torch's ``init_device_mesh``.

``init_device_mesh()`` on a system of chips is the mesh (chips x PEs per chip) named
``("chip", "pe")``: PEs are numbered chip-major (``Machine.chip_of``), so a row of the mesh
is one chip's PEs and a column takes one PE of every chip. Any other shape of the same PEs
(row-major, e.g. ``(2, 2, 4)`` trays x chips x PEs, or ``(4, 4)`` on 16 PEs) is a reshaping of
that order. A placement per mesh dimension then says where the collectives of a
redistribution run: along ``"pe"`` on the lines inside each chip (its NoC), along
``"chip"`` on the lines across chips (the system's network).
"""
from __future__ import annotations

from math import prod

from ..topology import as_machine
from .placement import Mesh


def init_device_mesh(shape=None, mesh_dim_names=("chip", "pe"), machine=None) -> Mesh:
    """A mesh of every PE of ``machine`` (default: the current one) of ``shape`` (default:
    chips x PEs per chip; one chip: ``(1, PEs)``) with dimensions ``mesh_dim_names``
    (None: unnamed). ``ValueError`` names the shape and the machine's PEs when they differ."""
    machine = as_machine(machine)
    n = len(machine.pes)
    chips = machine.chips
    structure = f"{n} PEs ({chips} chip{'s' if chips != 1 else ''} x {n // chips} PEs)"
    if shape is None:
        if mesh_dim_names is not None and len(mesh_dim_names) != 2:
            raise ValueError(f"init_device_mesh: mesh_dim_names {tuple(mesh_dim_names)} need a shape "
                             f"(the default shape is chips x PEs per chip, (chip, pe))")
        shape = (chips, n // chips)
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not shape or any(not isinstance(s, int) or s < 1 for s in shape):
        raise ValueError(f"init_device_mesh: mesh shape {shape} must be positive integers")
    if prod(shape) != n:
        raise ValueError(f"init_device_mesh: mesh shape {shape} has {prod(shape)} PEs; topology "
                         f"'{machine.name}' has {structure}")
    if mesh_dim_names is not None and len(mesh_dim_names) != len(shape):
        raise ValueError(f"init_device_mesh: {len(tuple(mesh_dim_names))} mesh_dim_names {tuple(mesh_dim_names)} "
                         f"for the {len(shape)} dimensions of mesh shape {shape}")
    return Mesh(tuple(range(n)), shape, machine, None if mesh_dim_names is None else tuple(mesh_dim_names))


def chip_lines(mesh: Mesh, dim) -> bool:
    """Whether the lines of mesh dimension ``dim`` join PEs of different chips (their
    collectives cross the system's network)."""
    machine = mesh.machine
    d = mesh.dim_index(dim)
    stride = prod(mesh.shape[d + 1:])
    return mesh.shape[d] > 1 and any(machine.chip_of(mesh.pes[i]) != machine.chip_of(mesh.pes[i + stride])
                                     for i in range(len(mesh.pes) - stride) if (i // stride) % mesh.shape[d] == 0)


def replica(mesh: Mesh, dim, index: int = 0) -> Mesh:
    """The mesh of the PEs at coordinate ``index`` of dimension ``dim`` (an index or a name):
    one data-parallel replica of a ``(dp, chip, pe)`` mesh, its other dimensions kept."""
    d = mesh.dim_index(dim)
    if not 0 <= index < mesh.shape[d]:
        raise ValueError(f"replica {index} of mesh dimension {dim!r}: it has coordinates 0..{mesh.shape[d] - 1}")
    stride = prod(mesh.shape[d + 1:])
    pes = tuple(p for i, p in enumerate(mesh.pes) if (i // stride) % mesh.shape[d] == index)
    keep = tuple(e for e in range(mesh.ndim) if e != d) or (d,)
    names = None if mesh.names is None else tuple(mesh.names[e] for e in keep)
    return Mesh(pes, tuple(mesh.shape[e] if e != d else 1 for e in keep), mesh.machine, names)
