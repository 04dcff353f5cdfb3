"""``a[M, K] @ b[K, N]`` on a mesh of several dimensions with a different placement along each
(``(Shard(1), Shard(0))``: column-parallel across chips, row-parallel inside each), in the
manner of DTensor's per-mesh-dimension sharding rules. A placement the same along every
dimension is the 1-D rule over the mesh's PEs in order (``ops_matmul._matmul``).

Along each mesh dimension, by ``b``'s placement there:

- ``Shard(1)`` (columns): ``a`` must be replicated there (gathered, or reduced if partial);
  the result is ``Shard(1)``;
- ``Shard(0)`` (rows, K): ``a`` ``Shard(1)``, or replicated (sliced for free), else gathered;
  the result is ``Partial()``;
- ``Replicate()``: the result follows ``a``: ``Shard(0)`` stays, ``Shard(1)`` (K) gives
  ``Partial()`` (``b`` sliced for free), ``Partial()`` stays (the product is linear in ``a``);
- ``Partial()``: ``b`` is reduced first.

Every PE then multiplies its own block, ``M/Sm x K/Sk`` by ``K/Sk x N/Sn`` (``S``: the product
of the mesh sizes along which the result splits M, the reduction splits K, the result splits
N; a replicated dimension repeats the work on each of its coordinates, as DTensor does),
timed as the GEMM of independent column slices (``slices="n"``: each PE its ``N/Sn`` columns
of a ``Sn x P / Sn``-times-wider product) on all the mesh's PEs. The result keeps the mesh
and its per-dimension placements; a ``Partial()`` along some dimensions is reduced where it
is used, by the collectives of those dimensions (``redistribute.steps``).
"""
from __future__ import annotations

from math import prod

from ..placement.spec import Partial, Replicate, Shard, Spec
from ..timing import kernel_dtype, timed


def _rule(pa, pb) -> tuple:
    """(placement ``a`` needs, placement ``b`` needs, result's, whether K splits) along one
    mesh dimension (module docstring)."""
    if isinstance(pb, Partial):
        pb = Replicate()
    sa = pa.dim % 2 if isinstance(pa, Shard) else None
    if isinstance(pb, Shard) and pb.dim % 2 == 1:
        return Replicate(), pb, Shard(1), False
    if isinstance(pb, Shard):
        a = pa if sa == 1 or isinstance(pa, Replicate) else Replicate()
        return a, pb, Partial(), True
    if sa == 0:
        return pa, pb, Shard(0), False
    if sa == 1:
        return pa, pb, Partial(), True
    return pa, pb, Partial() if isinstance(pa, Partial) else Replicate(), False


def on_mesh(x, mesh) -> tuple:
    """``x``'s placements on ``mesh``: its own on that mesh; a placement uniform over the
    same PEs in order is the same along every dimension; anything else is made replicated."""
    spec = x._spec
    if spec.mesh == mesh:
        return x, spec.placements
    if spec.mesh.pes == mesh.pes and spec.uniform is not None:
        return x, (spec.uniform,) * len(mesh.shape)
    rep = x.redistribute([Replicate()] * len(spec.placements))
    return rep, (Replicate(),) * len(mesh.shape)


def mesh_matmul(machine, op: str, a, b, gemm) -> tuple:
    """(result ``Spec``, ``Timed`` run) of ``a @ b`` by the per-dimension rules; ``gemm`` is
    ``ops_matmul._gemm`` (cached GEMM runs)."""
    mesh = b._spec.mesh if len(b._spec.placements) > 1 else a._spec.mesh
    a, pa = on_mesh(a, mesh)
    b, pb = on_mesh(b, mesh)
    rules = [_rule(x, y) for x, y in zip(pa, pb)]
    want_a, want_b = tuple(r[0] for r in rules), tuple(r[1] for r in rules)
    if want_b != tuple(pb):
        b = type(b)(b._value, Spec(mesh, pb), owns=False).redistribute(want_b)
    if want_a != tuple(pa):
        a = type(a)(a._value, Spec(mesh, pa), owns=False).redistribute(want_a)
    out = tuple(r[2] for r in rules)
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    sm, sn, sk = (prod(mesh.shape[d] for d, r in enumerate(rules) if test(r))
                  for test in (lambda r: r[2] == Shard(0), lambda r: r[2] == Shard(1), lambda r: r[3]))
    p = len(mesh.pes)
    m_loc, n_loc, k_loc = -(-m // sm), -(-n // sn), -(-k // sk)
    name, _ = kernel_dtype(a._value, op)
    run = gemm(machine, m_loc, n_loc * p, k_loc, name, "n", tuple(mesh.pes))
    detail = f"{run.plan}; mesh {mesh.shape} {list(pb)}: {m_loc}x{n_loc}x{k_loc} per PE"
    return Spec(mesh, out), timed(op, (a, b), "gemm", run.result, run.flops, detail)
