"""Softmax, row reductions and normalisation on the ahbm device: one vector pass each.

Numerics: the torch op on the host values. Timing: the vector MATH kernel over the input's
elements with the op's work per element (softmax: max, subtract, exp, sum, divide = 8
flops; log-softmax 9; rms_norm: square, sum, rsqrt, two multiplies = 5; a reduction: 1)
and its output size (``out_ratio``).
"""
from __future__ import annotations

import torch

from .dispatch import Out, register, same_device, value_of
from .kernels import dtype_of, mesh_pes, on, timed, vector
from .sharding import placement, rowwise_input, rowwise_output

aten = torch.ops.aten

FLOPS = {"_softmax": 8, "softmax": 8, "_log_softmax": 9, "log_softmax": 9, "rms_norm": 5, "mean": 1, "sum": 1, "amax": 1, "pow": 1}


@register(*(getattr(aten, name) for name in FLOPS))
def vector_pass(func, args, kwargs, machine):
    name = func.overloadpacket.__name__
    same_device(name, args)
    x = value_of(args[0])
    out = func(*(value_of(a) for a in args), **kwargs)
    dtype, eb = dtype_of(name, x)
    dims = _dims(name, args, kwargs, x.dim())
    src = rowwise_input(args[0], dims)
    n = x.numel()
    run = vector(machine, name, n, placed=placement(src), pes=mesh_pes(src), shape=tuple(src.shape), inputs=1, dtype=dtype,
                 elem_bytes=eb, flops_per_element=FLOPS[name], out_ratio=out.numel() / max(1, n))
    return Out(out, on(src, rowwise_output(src, dims, out.dim())),
               runs=(timed(f"aten::{name}", args, f"vector {name}", run, FLOPS[name] * n),))


def _dims(name: str, args, kwargs, rank: int) -> tuple:
    """The dimensions an op reduces over (softmax: its dim; rms_norm: the normalised shape;
    mean/sum/amax: ``dim`` or all; pow: none)."""
    if name == "pow":
        return ()
    if name == "rms_norm":
        return tuple(range(rank - len(args[1]), rank))
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if dim is None or dim == []:
        return tuple(range(rank))
    return tuple(dim) if isinstance(dim, (list, tuple)) else (dim,)
