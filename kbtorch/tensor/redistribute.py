"""Placement changes of ahbm tensors, timed by the collective kernels.

``redistribute(x, placements)`` changes the placement mesh dimension by mesh dimension and
runs the collective that change needs on the PEs of every line of that dimension at once,
recording it on the stream (one line: the algorithm with the least estimate; several:
rings side by side: ``kbtorch.ops.collective_concurrent.on_groups``; cached per shape):

- ``Shard(d) -> Replicate()``: all-gather; ``Partial() -> Replicate()``: all-reduce;
  ``Partial() -> Shard(d)``: reduce-scatter, each of the tensor's full size per member;
- ``Replicate() -> Shard(d)``: every PE keeps its part of what it has: no data moves;
- ``Shard(d) -> Shard(e)``: all-gather, then every PE keeps its part (NOTE: an all-to-all
  would move 1/n of that; the collectives have none yet, so this is an upper bound);
- ``-> Partial()`` is not supported and says so.

The numeric value is the tensor's global value, which no placement change alters. A
payload that does not split into the algorithm's blocks is padded up to the next multiple
of 2 x members elements (the padding is timed, it is what a kernel would move).
"""
from __future__ import annotations

from functools import lru_cache, partial
from math import prod

import torch

from ..ops.collective_concurrent import on_groups_run
from .dispatch import root
from .kernels import Rows, Timed, kernel_dtype
from .placement import Partial, Replicate, Shard, Spec
from .stream import CAPTURE, record, tracing


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


@lru_cache(maxsize=512)
def _timed(machine, kind: str, lines: tuple, nbytes: int, dtype: str) -> tuple:
    """(latency ns, algorithm, RunResult) of the collective on every line at once (``on_groups_run``)."""
    return on_groups_run(kind, list(lines), nbytes=nbytes, dtype=dtype, machine=machine)


def _rows_result(machine, kind: str, lines: tuple, per_row: int, eb: int, dtype: str, rows: int):
    n = len(lines[0])
    elems = -(-rows * per_row // (2 * n)) * 2 * n
    return _timed(machine, kind, lines, elems * eb, dtype)[2]


def rows(machine, kind: str, lines: tuple, shape: tuple, eb: int, dtype: str) -> Rows:
    """The collective split along its tensor's rows (its leading dimensions; graph mode's
    overlap): the same collective, on the same groups, of fewer rows."""
    count = prod(shape[:-1]) if shape else 1
    return Rows(kind, count, partial(_rows_result, machine, kind, lines, shape[-1] if shape else 1, eb, dtype))


def redistribute(x, placements):
    """``x`` (an ``AhbmTensor``) with new ``placements`` on the same mesh (see the module
    docstring); the result is of ``x``'s type."""
    # NOTE: ``type(x)`` rather than an import of AhbmTensor, whose methods call this module.
    wrap = type(x)
    spec = Spec(x._spec.mesh, tuple(placements))
    spec.check(tuple(x.shape))
    everywhere = all(isinstance(p, Replicate) for p in spec.placements)
    base = root(x)
    if everywhere and getattr(base, "_replicated", None) == spec.mesh:
        return wrap(x._value, spec, owns=False)
    name, eb = kernel_dtype(x._value, "redistribute")
    for dim, (old, new) in enumerate(zip(x._spec.placements, spec.placements)):
        kind = _kind(old, new)
        if kind is None:
            continue
        lines = _lines(spec.mesh, dim)
        n = len(lines[0])
        elems = -(-x.numel() // (2 * n)) * 2 * n
        latency, algo, result = _timed(spec.mesh.machine, kind, tuple(tuple(g) for g in lines), elems * eb, name)
        what = (f"redistribute {old!r}->{new!r}", (tuple(x.shape),), f"{kind} {algo} x{len(lines)}")
        detail = f"mesh dim {dim}, {n} PEs per group"
        graph = CAPTURE.get()
        if tracing():
            pass
        elif graph is not None:
            split = rows(spec.mesh.machine, kind, tuple(tuple(g) for g in lines), tuple(x.shape), eb, name)
            graph.kernel(spec.mesh.machine, Timed(*what, result, 0, detail, split))
            if everywhere and hasattr(graph, "replicas"):
                graph.replicas[id(base)] = len(graph.kernels) - 1
        else:
            record(*what, latency, bytes=elems * eb * len(lines), detail=detail)
    if everywhere:
        base._replicated = spec.mesh
    return wrap(x._value, spec)


def full_tensor(x) -> torch.Tensor:
    """The global value on the host, after making it replicated (timed)."""
    rep = redistribute(x, [Replicate()] * len(x._spec.placements))
    return rep.cpu()
