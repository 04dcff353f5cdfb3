"""Placement changes of ahbm tensors, timed by the collective kernels.

``redistribute(x, placements)`` changes the placement mesh dimension by mesh dimension and
runs the collective that change needs on the PEs of every line of that dimension at once,
recording it on the stream (one line: the algorithm with the least estimate; several:
side by side, each with the best line algorithm: ``kbtorch.ops.collective.side_by_side.on_groups``;
cached per shape):

- ``Shard(d) -> Replicate()``: all-gather; ``Partial() -> Replicate()``: all-reduce;
  ``Partial() -> Shard(d)``: reduce-scatter, each of the tensor's full size per member;
- ``Replicate() -> Shard(d)``: every PE keeps its part of what it has: no data moves;
- ``Shard(d) -> Shard(e)``: all-gather, then every PE keeps its part (NOTE: an all-to-all
  would move 1/n of that; the collectives have none yet, so this is an upper bound);
- ``-> Partial()`` is not supported and says so;
- on a mesh of several dimensions, each collective moves what a line holds (``steps``), and
  a reduction along several dimensions is hierarchical (reduce-scatter inside, all-reduce
  across, all-gather inside); a dimension of size 1 moves nothing.

The numeric value is the tensor's global value, which no placement change alters. A
payload that does not split into the algorithm's blocks is padded up to the next multiple
of 2 x members elements (the padding is timed, it is what a kernel would move).
"""
from __future__ import annotations

from functools import partial
from math import prod

import torch

from ..kernel import by_fidelity
from ..ops.collective.side_by_side import on_groups_run
from .dispatch import root, uid
from .placement.spec import Partial, Replicate, Shard, Spec
from .stream import CAPTURE, record, tracing
from .timing import Rows, Timed, kernel_dtype
from .. import state


def _lines(mesh, dim: int) -> list[tuple]:
    """PE groups along mesh dimension ``dim``: one per combination of the other coordinates."""
    shape = mesh.shape
    stride = prod(shape[dim + 1:])
    out = []
    for base in range(len(mesh.pes)):
        if (base // stride) % shape[dim] == 0:
            out.append(tuple(mesh.pes[base + i * stride] for i in range(shape[dim])))
    return out


def _kind(old, new) -> str | None:
    if old == new or (isinstance(old, Replicate) and isinstance(new, Shard)):
        return None
    if isinstance(old, Shard) and isinstance(new, (Replicate, Shard)):
        return "all_gather"
    if isinstance(old, Partial) and isinstance(new, Replicate):
        return "all_reduce"
    if isinstance(old, Partial) and isinstance(new, Shard):
        return "reduce_scatter"
    raise NotImplementedError(f"kbtorch: redistribute {old!r} -> {new!r} is not supported yet")


@state.cache


@by_fidelity(512)
def _timed(machine, kind: str, lines: tuple, nbytes: int, dtype: str) -> tuple:
    """(latency ns, algorithm, RunResult) of the collective on every line at once (``on_groups_run``)."""
    return on_groups_run(kind, list(lines), nbytes=nbytes, dtype=dtype, machine=machine)


def padded(numel: int, members: int) -> int:
    """``numel`` elements padded up to the next multiple of 2 x ``members`` (the collective
    algorithms' blocks; the padding is timed, it is what a kernel would move)."""
    return -(-numel // (2 * members)) * 2 * members


def _rows_result(machine, kind: str, lines: tuple, per_row: int, eb: int, dtype: str, rows: int):
    elems = padded(rows * per_row, len(lines[0]))
    return _timed(machine, kind, lines, elems * eb, dtype)[2]


def rows(machine, kind: str, lines: tuple, shape: tuple, numel: int, eb: int, dtype: str) -> Rows:
    """The collective split along its tensor's rows (its leading dimensions; graph mode's
    overlap): the same collective, on the same groups, of fewer rows (``numel`` elements
    per member for all of them)."""
    count = prod(shape[:-1]) if shape else 1
    return Rows(kind, count, partial(_rows_result, machine, kind, lines, -(-numel // count), eb, dtype))


def steps(mesh, old: tuple, new: tuple, numel: int) -> list:
    """The collectives that take placements ``old`` to ``new`` on ``mesh``, in order:
    ``(mesh dim, kind, from, to, elements per member)``. Each runs on every line of its
    mesh dimension at once, on the part of the tensor a line holds: the full size over the
    PEs of the dimensions still sharded elsewhere.

    Several ``Partial() -> Replicate()`` dimensions reduce hierarchically, as NCCL's
    tree-of-rings does across nodes: reduce-scatter along the last of them (inside a chip on
    a (chip, pe) mesh), all-reduce of that 1/n along the others (across chips: 1/n of the
    bytes on the system's network), all-gather along the last. Reduce-scatters run innermost
    first and gathers outermost first, so that the inner dimensions divide what crosses chips."""
    current = list(old)
    out = []

    def held(dim: int) -> int:
        split = prod(mesh.shape[e] for e, p in enumerate(current) if e != dim and isinstance(p, Shard))
        return -(-numel // split)

    reduce = [d for d, (o, n) in enumerate(zip(old, new)) if isinstance(o, Partial) and isinstance(n, Replicate)
              and mesh.shape[d] > 1]
    if len(reduce) > 1:
        last = reduce[-1]
        out.append((last, "reduce_scatter", old[last], Shard(0), held(last)))
        current[last] = Shard(0)
        for d in reduce[:-1]:
            out.append((d, "all_reduce", old[d], Replicate(), held(d)))
            current[d] = Replicate()
        out.append((last, "all_gather", Shard(0), Replicate(), held(last)))
        current[last] = Replicate()
    scatter = [d for d in reversed(range(len(new))) if isinstance(current[d], Partial) and isinstance(new[d], Shard)]
    for dim in scatter + [d for d in range(len(new)) if d not in scatter]:
        was, want = current[dim], new[dim]
        kind = _kind(was, want)
        if kind is not None and mesh.shape[dim] > 1:
            out.append((dim, kind, was, want, held(dim)))
        current[dim] = want
    return out


def redistribute(x, placements):
    """``x`` (an ``AhbmTensor``) with new ``placements`` on the same mesh (see the module
    docstring and ``steps``); the result is of ``x``'s type."""
    # NOTE: ``type(x)`` rather than an import of AhbmTensor, whose methods call this module.
    wrap = type(x)
    spec = Spec(x._spec.mesh, tuple(placements))
    spec.check(tuple(x.shape))
    everywhere = all(isinstance(p, Replicate) for p in spec.placements)
    base = root(x)
    if everywhere and getattr(base, "_replicated", None) == spec.mesh:
        return wrap(x._value, spec, owns=False)
    name, eb = kernel_dtype(x._value, "redistribute")
    graph = CAPTURE.get()
    moved = False
    for dim, kind, old, new, numel in steps(spec.mesh, x._spec.placements, spec.placements, x.numel()):
        _record(spec.mesh, dim, kind, f"redistribute {old!r}->{new!r}", tuple(x.shape), numel, eb, name)
        moved = True
    if moved and everywhere and graph is not None and not tracing() and hasattr(graph, "replicas"):
        graph.replicas[uid(base)] = len(graph.kernels) - 1
    if everywhere:
        base._replicated = spec.mesh
    return wrap(x._value, spec)


def _record(mesh, dim: int, kind: str, label: str, shape: tuple, numel: int, eb: int, dtype: str) -> None:
    """Time collective ``kind`` of ``numel`` elements per member on every line of mesh
    dimension ``dim`` and record it on the stream (or in the graph being captured)."""
    lines = tuple(tuple(g) for g in _lines(mesh, dim))
    n = len(lines[0])
    elems = padded(numel, n)
    latency, algo, result = _timed(mesh.machine, kind, lines, elems * eb, dtype)
    what = (label, (shape,), f"{kind} {algo} x{len(lines)}")
    where = f"'{mesh.names[dim]}'" if mesh.names else str(dim)
    detail = f"mesh dim {where}, {n} PEs per group"
    graph = CAPTURE.get()
    if tracing():
        pass
    elif graph is not None:
        split = rows(mesh.machine, kind, lines, shape, numel, eb, dtype)
        graph.kernel(mesh.machine, Timed(*what, result, 0, detail, split, lines))
    else:
        record(*what, latency, bytes=elems * eb * len(lines), detail=detail, obtained=result.obtained)


def full_tensor(x) -> torch.Tensor:
    """The global value on the host, after making it replicated (timed)."""
    rep = redistribute(x, [Replicate()] * len(x._spec.placements))
    return rep.cpu()
