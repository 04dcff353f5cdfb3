"""Elementwise ops on the ahbm device: the elementwise MATH kernel (``kbtorch.ops.elementwise``).

Numerics: the torch op on the host values (broadcasting as torch does). Timing: one pass
with one input per tensor argument over each PE's part of the output (its shard, or all of
it when the result is replicated); placements follow ``sharding.elementwise_inputs``.
"""
from __future__ import annotations

import torch

from .dispatch import Out, is_ahbm, register, same_device, value_of
from .kernels import dtype_of, mesh_pes, on, timed, vector
from .sharding import elementwise_inputs, placement

aten = torch.ops.aten

#: aten op -> MATH engine op (its flops per element are the kernel API's).
MATH_OPS = {"add": "add", "sub": "add", "mul": "mul", "div": "div", "maximum": "max", "silu": "silu",
            "gelu": "gelu", "exp": "exp", "rsqrt": "rsqrt", "neg": "mul", "abs": "max"}
IN_PLACE = ("add_", "sub_", "mul_", "div_")


@register(*(getattr(aten, name) for name in (*MATH_OPS, *IN_PLACE)))
def elementwise(func, args, kwargs, machine):
    """Out-of-place ops return a new tensor; in-place ones (``add_``) update ``args[0]``."""
    name = func.overloadpacket.__name__
    base = name.rstrip("_")
    same_device(name, args)
    out = func(*(value_of(a) for a in args), **kwargs)
    dtype, eb = dtype_of(name, out)
    tensors = [a for a in args if is_ahbm(a)]
    _, placed = elementwise_inputs(tensors, tuple(out.shape))
    if name.endswith("_"):
        placed = placement(args[0])
    run = vector(machine, MATH_OPS[base], out.numel(), placed=placed, pes=mesh_pes(tensors[0]),
                 shape=tuple(out.shape), inputs=len(tensors) or 1, dtype=dtype, elem_bytes=eb)
    flops = machine.math_flops(MATH_OPS[base]) * out.numel()
    runs = (timed(f"aten::{name}", args, f"elementwise {MATH_OPS[base]}", run, flops),)
    if name.endswith("_"):
        return Out(args[0], runs=runs)
    return Out(out, on(tensors[0], placed), runs=runs)
