"""Elementwise ops on the ahbm device: the elementwise MATH kernel (``kbtorch.ops.elementwise``).

Numerics: the torch op on the local values (broadcasting as torch does). Timing: one pass
with one input per tensor argument over each PE's part of the output (its shard, or all of
it when the result is replicated); placements follow ``sharding.elementwise_inputs``.
"""
from __future__ import annotations

from .dispatch import implements, same_device
from .kernels import dtype_of, machine, mesh_pes, record, vector, wrap
from .sharding import elementwise_inputs, placement
from .tensor import AhbmTensor, local

#: aten op -> MATH engine op (its flops per element are the kernel API's).
MATH_OPS = {"add": "add", "sub": "add", "mul": "mul", "div": "div", "maximum": "max", "silu": "silu",
            "gelu": "gelu", "exp": "exp", "rsqrt": "rsqrt", "neg": "mul", "abs": "max"}


def _handler(func, args, kwargs):
    """Out-of-place ops return a new tensor; in-place ones (``add_``) update ``args[0]``."""
    name = func.overloadpacket.__name__
    base = name.rstrip("_")
    same_device(name, args)
    out = func(*(local(a) for a in args), **kwargs)
    dtype, eb = dtype_of(name, out)
    tensors = [a for a in args if isinstance(a, AhbmTensor)]
    _, placed = elementwise_inputs(tensors, tuple(out.shape))
    if name.endswith("_"):
        placed = placement(args[0])
    run = vector(MATH_OPS[base], out.numel(), placed=placed, pes=mesh_pes(tensors[0]), shape=tuple(out.shape),
                 inputs=len(tensors) or 1, dtype=dtype, elem_bytes=eb)
    flops = machine().math_flops(MATH_OPS[base]) * out.numel()
    record(f"aten::{name}", args, f"elementwise {MATH_OPS[base]}", run, flops)
    if name.endswith("_"):
        return args[0]
    return wrap(out, placed, like=tensors[0])


implements(*MATH_OPS, *(f"{op}_" for op in ("add", "sub", "mul", "div")))(_handler)
