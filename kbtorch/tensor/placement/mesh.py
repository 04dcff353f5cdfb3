"""The ``Mesh`` of PEs an ahbm tensor is laid over, in the manner of torch's ``DeviceMesh``.

A mesh is a tuple of PE ids, viewed as an n-dimensional grid (``shape``, row-major, e.g.
SIP x CUBE x PE or flat). ``init_device_mesh()`` on a system of chips is the mesh (chips x
PEs per chip) named ``("chip", "pe")``: PEs are numbered chip-major (``Machine.chip_of``), so
a row of the mesh is one chip's PEs and a column takes one PE of every chip. Any other
shape of the same PEs (row-major, e.g. ``(2, 2, 4)`` trays x chips x PEs, or ``(4, 4)`` on 16
PEs) is a reshaping of that order. A placement per mesh dimension then says where the
collectives of a redistribution run: along ``"pe"`` on the lines inside each chip (its NoC),
along ``"chip"`` on the lines across chips (the system's network).

A chip mesh (``chip_mesh``, for the parallel styles across chips: ``expert_parallel``,
``pipeline_parallel``) is that mesh or its first rows: row ``c`` holds the PEs of chip ``c``,
so ``mesh.shape == (chips, PEs per chip)``. ``chip_rows`` checks that a mesh is one: every
row inside one chip, no chip twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from ...topology import as_machine


@dataclass(frozen=True)
class Mesh:
    """PE ids ``pes`` of ``machine`` (default: the current one, ``kbtorch.use``) laid out
    row-major on a grid of ``shape``, its dimensions optionally named (``names``, as
    torch's ``mesh_dim_names``; ``kbtorch.init_device_mesh`` builds one from the machine's
    chips). A tensor remembers its machine through its mesh. ``mesh["pe"]``: the sub-mesh
    of the named dimension(s) (``SubMesh``)."""

    pes: tuple
    shape: tuple
    machine: object = field(default=None, repr=False)
    names: tuple | None = None

    def __post_init__(self):
        object.__setattr__(self, "machine", as_machine(self.machine))
        object.__setattr__(self, "shape", tuple(self.shape))
        if prod(self.shape) != len(self.pes) or not self.pes:
            raise ValueError(f"mesh of shape {self.shape} needs {prod(self.shape)} PEs, got {len(self.pes)}")
        if len(set(self.pes)) != len(self.pes):
            raise ValueError(f"mesh names a PE twice: {list(self.pes)}")
        if self.names is not None:
            object.__setattr__(self, "names", tuple(self.names))
            if len(self.names) != len(self.shape) or len(set(self.names)) != len(self.names):
                raise ValueError(f"mesh_dim_names {self.names} do not name the {len(self.shape)} dimensions of "
                                 f"mesh shape {self.shape} once each")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def size(self, dim=None) -> int:
        """PEs of the mesh, or along dimension ``dim`` (an index or a name)."""
        return len(self.pes) if dim is None else self.shape[self.dim_index(dim)]

    def dim_index(self, dim) -> int:
        """The index of mesh dimension ``dim`` (an index or one of ``names``)."""
        if isinstance(dim, int) and -self.ndim <= dim < self.ndim:
            return dim % self.ndim
        if isinstance(dim, str) and self.names and dim in self.names:
            return self.names.index(dim)
        raise KeyError(f"mesh dimension {dim!r}: the mesh of shape {self.shape} has "
                       f"{'dimensions ' + ', '.join(map(repr, self.names)) if self.names else 'no named dimensions'}")

    def __getitem__(self, dims) -> "SubMesh":
        dims = (dims,) if isinstance(dims, (str, int)) else tuple(dims)
        return SubMesh(self, tuple(self.dim_index(d) for d in dims))

    def __deepcopy__(self, memo):
        # NOTE: immutable, and its machine is shared: torch.compile's guards deep-copy a
        # tensor's metadata and compare it with ``==`` (a copied machine would never match).
        return self


@dataclass(frozen=True)
class SubMesh:
    """Dimensions ``dims`` of ``parent`` (``mesh["pe"]``), as torch's sub-mesh of a
    ``DeviceMesh``. A tensor placed on it (``placements`` for those dimensions only) lies on
    the whole parent mesh, replicated along the other dimensions (``expand``): the global
    view of what every rank's sub-mesh holds in torch."""

    parent: Mesh
    dims: tuple

    @property
    def shape(self) -> tuple:
        return tuple(self.parent.shape[d] for d in self.dims)

    @property
    def ndim(self) -> int:
        return len(self.dims)

    @property
    def names(self) -> tuple | None:
        return None if self.parent.names is None else tuple(self.parent.names[d] for d in self.dims)

    @property
    def machine(self):
        return self.parent.machine

    def size(self, dim=None) -> int:
        return prod(self.shape) if dim is None else self.parent.size(self.dims[self.names.index(dim)]
                                                                     if isinstance(dim, str) else self.dims[dim])


def holders(mesh: Mesh, size: int) -> tuple:
    """The PEs of ``mesh`` holding a part of a tensor dimension of ``size`` slices that is
    ``Shard`` along every mesh dimension, in mesh order. Along each outer dimension the slices
    are dealt as DTensor's nested sharding deals them (``torch.chunk``: ``ceil(n / k)`` per
    coordinate, the last ones possibly empty); along the innermost, over ``min(n, k)`` PEs
    (the kernels' balanced split). On a one-dimensional mesh: its first ``min(size, PEs)``.

    NOTE: ``Spec.uniform`` reads such a tensor as sharded over the mesh's PEs in order; the
    two agree when ``size`` splits evenly, but not when it is smaller: 8 kv heads on
    (8 chips x 36 PEs) lie one per chip (on each chip's first PE), not on chip 0's first 8."""
    def deal(pes: tuple, shape: tuple, n: int) -> list:
        if len(shape) == 1:
            return list(pes[:min(n, len(pes))])
        step, per = len(pes) // shape[0], -(-n // shape[0])
        return [p for i in range(shape[0])
                for p in deal(pes[i * step:(i + 1) * step], shape[1:], max(0, min(per, n - i * per)))]
    return tuple(deal(tuple(mesh.pes), tuple(mesh.shape), size)) or tuple(mesh.pes[:1])


def flat_mesh(mesh: Mesh) -> Mesh:
    """The same PEs of the same machine as a one-dimensional mesh."""
    return Mesh(mesh.pes, (len(mesh.pes),), mesh.machine)


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
