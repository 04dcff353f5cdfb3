"""Sharding propagation: where an op's result lies and which inputs must move first.

Rules, on a one-dimensional mesh; a mesh of several dimensions with the same placement along
each (``Spec.uniform``) follows them as that placement over its PEs in order, and results stay
on it; a mixed placement is first made replicated where it matters (``flat``), except in
matmul (``ops_matmul_mesh``: per mesh dimension):

- elementwise ops (with broadcasting): the result is ``Shard(d)`` if an input is sharded on
  a dimension that maps to output dimension ``d``; ``Replicate()`` inputs are used locally
  (each PE takes its part, free); an input sharded on another dimension is all-gathered;
  a ``Partial()`` input is reduced first: reduce-scatter to ``Shard`` of the first output
  dimension that splits over the mesh (sequence parallelism), else all-reduce.
- row-wise ops (softmax, norms, reductions over ``dims``): an input sharded on a reduced
  dimension is all-gathered first, but a sum or mean of it gives ``Partial()`` (each PE
  sums its part, ``reduces_shard``); the result keeps the shard (renumbered if dims go).
- matmul ``a[M, K] @ b[K, N]`` (see ``ops_matmul``): column-parallel ``b`` Shard(1) gives
  ``Shard(1)`` (``a`` made replicated), row-parallel ``b`` Shard(0) with ``a`` Shard(1) (or
  Replicate, sliced for free) gives ``Partial()``.

Each PE works on its shard: a sharded result of ``n`` elements costs ``n / P`` elements per
PE, a replicated one ``n`` per PE (every PE computes the whole, no communication).
"""
from __future__ import annotations

from .mesh import flat_mesh
from .spec import SHARD_MIN_PER_PE, Partial, Replicate, Shard, Spec, first_split_dim


def placement(x):
    """The single placement of an ahbm tensor as on a 1-D mesh (None for a host value): on
    a mesh of several dimensions, the one placement they all have (``Spec.uniform``: the
    same over the mesh's PEs in order), else ``Replicate()`` (see ``flat``)."""
    spec = getattr(x, "_spec", None)
    if spec is None:
        return None
    if len(spec.placements) == 1:
        return spec.placements[0]
    return spec.uniform or Replicate()


def shard_dim(x) -> int | None:
    p = placement(x)
    return p.dim % x.dim() if isinstance(p, Shard) else None


def to_all(x, p):
    """``x`` redistributed to placement ``p`` along every mesh dimension (timed)."""
    return x.redistribute([p] * len(x._spec.placements))


def flat(x):
    """``x`` as on a 1-D mesh: a uniform placement (the same along every mesh dimension) as
    it is (``placement`` reads it), a mixed one made replicated (timed)."""
    spec = x._spec
    if len(spec.placements) == 1 or spec.uniform is not None:
        return x
    rep = to_all(x, Replicate())
    return type(x)(rep._value, Spec(flat_mesh(spec.mesh), (Replicate(),)), owns=False)


def settle_partial(x, out_shape: tuple | None = None):
    """A Partial input reduced: reduce-scatter onto the first output dimension that splits
    over the mesh (when ``x`` is large, as ``default_spec``, and has that dimension at full
    size in the output), else all-reduce (on a mesh of several dimensions: along each, as
    ``redistribute.steps`` orders them: hierarchically)."""
    if not isinstance(placement(x), Partial):
        return x
    n = len(x._spec.mesh.pes)
    d = first_split_dim(tuple(x.shape), n) if x.numel() >= n * SHARD_MIN_PER_PE else None
    if d is not None and (out_shape is None or (len(out_shape) == x.dim() and out_shape[d] == x.shape[d])):
        return to_all(x, Shard(d))
    return to_all(x, Replicate())


def elementwise_inputs(tensors: list, out_shape: tuple) -> tuple[list, object]:
    """(inputs made compatible, output placement) for an elementwise op (module docstring)."""
    tensors = [settle_partial(flat(t), out_shape) if hasattr(t, "_spec") else t for t in tensors]
    out_dim, owner = None, None
    for t in tensors:
        d = shard_dim(t) if hasattr(t, "_spec") else None
        if d is None:
            continue
        mapped = d + len(out_shape) - t.dim()
        if t.shape[d] != out_shape[mapped]:
            continue
        if out_dim is None:
            out_dim, owner = mapped, t
    fixed = []
    for t in tensors:
        d = shard_dim(t) if hasattr(t, "_spec") else None
        if d is not None and (out_dim is None or t is not owner and d + len(out_shape) - t.dim() != out_dim):
            t = to_all(t, Replicate())
        fixed.append(t)
    return fixed, Shard(out_dim) if out_dim is not None else Replicate()


def reduces_shard(x, dims: tuple) -> bool:
    """Whether ``x`` (on a 1-D mesh, or the same along every mesh dimension) is sharded on
    one of the reduced ``dims``: then a sum or
    mean runs on each PE's part into a ``Partial()`` result, a norm all-reduces its rows'
    statistics and a max/argmax gathers each PE's winners (``ops_reduce``).

    NOTE: those reductions decompose over the parts (a sum is linear), so the whole input
    is never gathered first: an RMSNorm of a hidden-sharded activation moves a few values
    per row, as a tensor-parallel norm does."""
    d = shard_dim(x)
    return d is not None and d in {e % x.dim() for e in dims}


def rowwise_input(x, dims: tuple):
    """``x`` ready for a reduction over ``dims``: all-gathered if sharded on one of them."""
    x = settle_partial(flat(x))
    d = shard_dim(x)
    if d is not None and d in {e % x.dim() for e in dims}:
        x = to_all(x, Replicate())
    return x


def rowwise_output(x, dims: tuple, out_rank: int):
    """The result placement of a reduction of ``x`` over ``dims``."""
    d = shard_dim(x)
    if d is None:
        return Replicate()
    if out_rank == x.dim():
        return Shard(d)
    gone = sum(1 for e in {e % x.dim() for e in dims} if e < d)
    return Shard(d - gone)
