"""Placements of an ahbm tensor over a mesh of PEs (``mesh.Mesh``), in the manner of DTensor.

Along each mesh dimension a tensor is ``Shard(dim)`` (tensor
dimension ``dim`` split into equal chunks, one per mesh coordinate; the last chunks may be
shorter, as ``torch.chunk``), ``Replicate()`` (a full copy at every coordinate) or
``Partial()`` (every coordinate holds a partial sum; the value is their sum).
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from math import prod

from ... import state
from .mesh import Mesh, SubMesh


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


#: Elements per PE below which a new tensor is replicated rather than sharded.
# NOTE: a placement policy of the front end, not hardware.
SHARD_MIN_PER_PE = 1024


#: The mesh that new tensors and unplaced kernels use while it is set (a pipeline stage's
#: PEs, ``tensor.pipeline``; a data-parallel replica, ``home``), for its machine; None: every
#: PE of the machine.
SCOPE: ContextVar = state.context_var("kbtorch_scope", None)


def scoped_pes(machine) -> tuple | None:
    """The PEs of the scope (``SCOPE``) on ``machine``, or None (every PE); a scope of
    another machine is refused, naming both (its PEs are not ``machine``'s)."""
    scope = SCOPE.get()
    if scope is None:
        return None
    if scope.machine is not machine:
        raise ValueError(f"kbtorch.home: the mesh is of machine '{scope.machine.name}', but this op runs on "
                         f"'{machine.name}'; make the mesh on '{machine.name}' or use('{scope.machine.name}')")
    return tuple(scope.pes)


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
