"""Reductions, scans, selection, softmax and normalisation on the ahbm device: one vector
pass each (``kbtorch.ops.vector``) over the input's elements.

Each aten op maps to a cost CLASS (``CLASSES``) whose MATH work per input element is the
machine's (``flops_per_element`` in the topology file: ``reduce`` for sum/mean/max/argmax/
cumsum/..., ``var``, ``logsumexp``, ``sort`` for topk/sort, ``softmax`` (also torch's
``_safe_softmax``: fully masked rows give zeros), ``log_softmax``, ``rms_norm``,
``layer_norm``); the output size sets the bytes written (``out_ratio``).
Numerics: the torch op on the host values, every keyword argument as torch has it
(``out=`` refused). Placement: an input sharded on a reduced dimension is all-gathered
first, but a sum or mean of it is Partial (``sharding.reduces_shard``), and a norm of it
(``rms_norm``, ``layer_norm``) normalises each PE's part after an all-reduce of its rows'
statistics (``sharded_norm``), and a max/min/argmax/argmin over it picks each PE's winners
and all-gathers only those (``gathered_picks``); the result keeps the shard
(``sharding.rowwise_input``/``rowwise_output``).
"""
from __future__ import annotations

from math import prod

import torch
from torch.utils._pytree import tree_flatten

from ..dispatch import Out, host_call, refuse, register, same_device
from ..placement.sharding import placement, reduces_shard, rowwise_input, rowwise_output
from ..placement.spec import Partial, Replicate, Shard, Spec
from ..timing import kernel_dtype, mesh_of, on, timed, vector

aten = torch.ops.aten


def _classes(cls: str, names: str) -> dict:
    return {name: cls for name in names.split()}


#: aten op -> cost class (a name of the machine's ``flops_per_element`` table).
CLASSES = {
    **_classes("reduce", "sum mean nansum amax amin max min aminmax argmax argmin prod all any count_nonzero "
                         "cumsum cumprod cummax cummin"),
    **_classes("var", "var std var_mean std_mean linalg_vector_norm norm"),
    **_classes("logsumexp", "logsumexp logcumsumexp"),
    **_classes("sort", "topk sort kthvalue median"),
    **_classes("softmax", "softmax _softmax _safe_softmax"),
    **_classes("log_softmax", "log_softmax _log_softmax"),
    **_classes("rms_norm", "rms_norm"),
    **_classes("layer_norm", "layer_norm native_layer_norm"),
}
IN_PLACE = ("cumsum_", "cumprod_")
#: Linear reductions: over a sharded dimension, each PE reduces its part into a Partial result.
LINEAR = ("sum", "mean")
#: Norms over a sharded dimension -> fp32 statistics per row they all-reduce (sum of squares;
#: sum and sum of squares).
NORM_STATS = {"rms_norm": 1, "layer_norm": 2}
#: Selections over a sharded dimension: each PE's winners (value and index) are all-gathered.
PICKS = ("amax", "amin", "max", "min", "argmax", "argmin")
#: ops returning (values, indices) of chosen elements.
SELECTIONS = ("topk", "sort")


@register(*(getattr(aten, name) for name in (*CLASSES, *IN_PLACE)))
def vector_pass(func, args, kwargs, machine):
    name = func.overloadpacket.__name__
    refuse(func, kwargs)
    same_device(name, (args, kwargs))
    x = args[0]
    out = host_call(func, args, kwargs)
    if name in SELECTIONS and x._value.is_meta:
        out = (out[0], spread(out[1], reduced_dims(func, args, kwargs, x.dim())[0], x.shape))
    results = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    dims = reduced_dims(func, args, kwargs, x.dim())
    if name in LINEAR and reduces_shard(x, dims):
        src, where = x, on(x, Partial())
    elif name in NORM_STATS and reduces_shard(x, dims):
        src, where = sharded_norm(x, dims, NORM_STATS[name]), on(x, placement(x))
    elif name in PICKS and reduces_shard(x, dims):
        src, where = gathered_picks(x, results[0].numel()), on(x, Replicate())
    else:
        src = rowwise_input(x, dims)
        where = on(src, rowwise_output(src, dims, results[0].dim()))
    n = x.numel()
    if name.endswith("_"):
        out, where = args[0], None
    if not n:
        return Out(out, where)
    cls = CLASSES[name.rstrip("_")]
    dtype, eb = kernel_dtype(x._value, name)
    run = vector(machine, cls, n, placed=placement(src), pes=mesh_of(src), shape=tuple(src.shape), inputs=1,
                 dtype=dtype, elem_bytes=eb, out_ratio=sum(t.numel() for t in results) / n)
    return Out(out, where, runs=(timed(f"aten::{name}", args, f"vector {name}", run, machine.math_flops(cls) * n),))


def sharded_norm(x, dims: tuple, stats: int):
    """``x``, sharded on a normalised dimension, after the all-reduce of ``stats`` fp32
    values per row; returns ``x``.

    NOTE: as a tensor-parallel norm does: each PE sums its part of every row, the partial
    sums are all-reduced (a few bytes per row), and each PE normalises its part, so the
    output stays sharded and the activation is never gathered."""
    rows = x.numel() // prod(x.shape[d] for d in {e % x.dim() for e in dims})
    _replicate(x, rows * stats, Partial())
    return x


def gathered_picks(x, rows: int):
    """``x``, sharded on a reduced dimension, after the all-gather of every PE's winner of
    each of ``rows`` rows (a value and an index: two fp32 per row and PE); returns ``x``.

    NOTE: as a tensor-parallel greedy sampler does over vocabulary-sharded logits: each PE
    reduces its part, and choosing among the P candidates of a row is negligible next to
    gathering the whole row."""
    _replicate(x, len(x._spec.mesh.pes) * rows * 2, Shard(0))
    return x


def _replicate(x, numel: int, placed) -> None:
    """Time making ``numel`` fp32 values placed ``placed`` on ``x``'s mesh replicated (the
    collective is recorded on the stream); the values themselves are not kept."""
    values = torch.empty(numel, dtype=torch.float32, device="meta")
    n = len(x._spec.placements)
    type(x)(values, Spec(x._spec.mesh, (placed,) * n), owns=False).redistribute([Replicate()] * n)


def reduced_dims(func, args, kwargs, rank: int) -> tuple:
    """The dimensions an op works along, from its schema: ``normalized_shape`` (norms: the
    last ones), else ``dim`` (given, or its default; None or empty: all)."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name not in ("dim", "normalized_shape"):
            continue
        value = args[i] if i < len(args) else kwargs.get(arg.name, arg.default_value)
        if arg.name == "normalized_shape":
            return tuple(range(rank - len(value), rank))
        if value is None or value == []:
            break
        return tuple(value) if isinstance(value, (list, tuple)) else (value,)
    return tuple(range(rank))


def spread(indices: torch.Tensor, dim: int, shape: tuple) -> torch.Tensor:
    """Indices a selection picks from values that are not there (timing-only): row r takes
    ``(r * k + j) mod n`` for its j-th of k picks along a dimension of n.

    NOTE: so an MoE router in timing-only mode sends each token to distinct experts and
    spreads the tokens evenly over them, as a balanced router does (zeros would send
    every token to expert 0)."""
    n = shape[dim] if shape else 1
    moved = indices.movedim(dim, -1) if indices.dim() else indices.reshape(1)
    k = moved.shape[-1]
    rows = torch.arange(moved.numel() // max(1, k))[:, None] * k + torch.arange(k)[None, :]
    return (rows % max(1, n)).reshape(moved.shape).movedim(-1, dim if indices.dim() else 0).reshape(indices.shape)
