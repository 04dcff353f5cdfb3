"""Placements of an ahbm tensor over a mesh of PEs, in the manner of DTensor.

A mesh is a tuple of PE ids, viewed as an n-dimensional grid (``shape``, row-major, e.g.
SIP x CUBE x PE or flat). Along each mesh dimension a tensor is ``Shard(dim)`` (tensor
dimension ``dim`` split into equal chunks, one per mesh coordinate; the last chunks may be
shorter, as ``torch.chunk``), ``Replicate()`` (a full copy at every coordinate) or
``Partial()`` (every coordinate holds a partial sum; the value is their sum).
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from math import prod

from ..topology import as_machine


@dataclass(frozen=True)
class Shard:
    dim: int

    def __repr__(self) -> str:
        return f"Shard({self.dim})"


@dataclass(frozen=True)
class Replicate:
    def __repr__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True)
class Partial:
    op: str = "sum"

    def __repr__(self) -> str:
        return "Partial()" if self.op == "sum" else f"Partial({self.op!r})"


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


def expand(mesh, placements) -> tuple:
    """(the whole mesh, one placement per its dimension) of ``placements`` on ``mesh``: a
    ``Mesh`` as it is; a ``SubMesh``'s placements on its dimensions, ``Replicate()`` on the others."""
    placements = tuple(placements)
    if not isinstance(mesh, SubMesh):
        return mesh, placements
    if len(placements) != mesh.ndim:
        raise ValueError(f"{len(placements)} placements for the {mesh.ndim}-dimensional sub-mesh {mesh.names or mesh.dims}")
    full = [Replicate()] * mesh.parent.ndim
    for d, p in zip(mesh.dims, placements):
        full[d] = p
    return mesh.parent, tuple(full)


@dataclass(frozen=True)
class Spec:
    """How a tensor of ``shape`` lies on ``mesh``: one placement per mesh dimension."""

    mesh: Mesh
    placements: tuple

    def __post_init__(self):
        if len(self.placements) != len(self.mesh.shape):
            raise ValueError(f"{len(self.placements)} placements for a {len(self.mesh.shape)}-dimensional mesh")
        for p in self.placements:
            if not isinstance(p, (Shard, Replicate, Partial)):
                raise ValueError(f"placement {p!r} is not Shard, Replicate or Partial")

    def check(self, shape: tuple) -> None:
        """Raise ValueError if a placement does not fit a tensor of ``shape``."""
        for p in self.placements:
            if isinstance(p, Shard) and not -len(shape) <= p.dim < len(shape):
                raise ValueError(f"{p!r} of a tensor with {len(shape)} dimensions {tuple(shape)}")

    def __repr__(self) -> str:
        return f"Spec({len(self.mesh.pes)} PEs {self.mesh.shape}, {list(self.placements)})"

    @property
    def uniform(self):
        """The one placement every mesh dimension has (None if they differ): a tensor
        ``Shard(d)`` along every dimension of a row-major mesh is ``Shard(d)`` over its PEs
        in order, as on the flat mesh, when dimension ``d`` has a slice for every PE (else it
        lies on ``holders``); so are ``Replicate()`` and ``Partial()``."""
        first = self.placements[0]
        return first if all(p == first for p in self.placements) else None


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


#: Elements per PE below which a new tensor is replicated rather than sharded.
# NOTE: a placement policy of the front end, not hardware.
SHARD_MIN_PER_PE = 1024


#: The mesh that new tensors and unplaced kernels use while it is set (a pipeline stage's
#: PEs, ``tensor.pipeline``; a data-parallel replica, ``home``), for its machine; None: every
#: PE of the machine.
SCOPE: ContextVar = ContextVar("kbtorch_scope", default=None)


def scoped_pes(machine) -> tuple | None:
    """The PEs of the scope (``SCOPE``) on ``machine``, or None (every PE)."""
    scope = SCOPE.get()
    return tuple(scope.pes) if scope is not None and scope.machine is machine else None


@contextmanager
def home(mesh: Mesh):
    """Inside this block (this thread or task), new ahbm tensors of ``mesh``'s machine go on
    ``mesh``'s PEs (``default_spec``) and ops without a placement rule run their kernels there
    (``SCOPE``): a model on a part of the machine, e.g. one data-parallel replica."""
    token = SCOPE.set(mesh)
    try:
        yield mesh
    finally:
        SCOPE.reset(token)


def default_spec(machine, shape: tuple = ()) -> Spec:
    """Where a new ahbm tensor goes: over a flat mesh of every PE of ``machine`` (of the
    scope's PEs, ``SCOPE``, while one is set), sharded along its first dimension of at least
    that many rows if it is large (at least ``SHARD_MIN_PER_PE`` elements per PE: weights,
    long activations), else replicated (biases, norms' weights, a decode step's activations)."""
    pes = scoped_pes(machine) or tuple(range(len(machine.pes)))
    n = len(pes)
    mesh = Mesh(pes, (n,), machine)
    d = first_split_dim(tuple(shape), n) if prod(shape) >= n * SHARD_MIN_PER_PE else None
    return Spec(mesh, (Shard(d),) if d is not None else (Replicate(),))


def first_split_dim(shape: tuple, n_pes: int) -> int | None:
    """The first dimension of ``shape`` with at least ``n_pes`` rows (None if none has)."""
    for d, size in enumerate(shape):
        if size >= n_pes:
            return d
    return None


def view_placements(placements: tuple, op: str, args: tuple, in_shape: tuple, out_shape: tuple) -> tuple:
    """Placements of the result of a view ``op`` (``t``, ``transpose``, ``permute`` move the
    sharded dimension; other views keep it where the dimensions before it are unchanged).

    A view that splits the sharded dimension keeps the shard on the outermost of its parts
    (``[S, 3584]`` sharded on 3584 viewed as ``[S, 28, 128]`` is sharded on the 28 heads); a
    view that merges it, as the outermost, with inner dimensions keeps it on the merged one.

    NOTE: a split's chunks are not the original chunks (a PE held 14 of 3584 columns, it now
    holds a head): that re-layout is not charged. Any other view of a sharded dimension is
    taken as ``Replicate()`` (values are unaffected, only the placement)."""
    out = []
    for p in placements:
        if not isinstance(p, Shard):
            out.append(p)
            continue
        d = p.dim % len(in_shape) if in_shape else 0
        out.append(_moved(d, op, args, in_shape, out_shape))
    return tuple(out)


def _moved(d: int, op: str, args: tuple, in_shape: tuple, out_shape: tuple):
    if op == "t" and len(in_shape) == 2:
        return Shard(1 - d)
    if op == "transpose":
        a, b = (x % len(in_shape) for x in args[1:3])
        return Shard(b if d == a else a if d == b else d)
    if op == "permute":
        perm = [x % len(in_shape) for x in args[1]]
        return Shard(perm.index(d))
    before = prod(in_shape[:d])
    starts = [e for e in range(len(out_shape)) if prod(out_shape[:e]) == before]
    for e in starts:
        if out_shape[e] == in_shape[d]:
            return Shard(e)
    for e in starts:
        split = out_shape[e] > 1 and any(prod(out_shape[e:f]) == in_shape[d] for f in range(e + 2, len(out_shape) + 1))
        merged = any(prod(in_shape[d:f]) == out_shape[e] for f in range(d + 2, len(in_shape) + 1))
        if split or merged:
            return Shard(e)
    return Replicate()
