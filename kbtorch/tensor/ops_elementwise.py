"""Elementwise ops on the ahbm device: the elementwise MATH kernel (``kbtorch.ops.elementwise``).

Numerics: the torch op on the local values (broadcasting as torch does). Timing: one pass
over the output's elements with one input per tensor argument, on all PEs.
"""
from __future__ import annotations

import torch

from ..kernel.api import MATH_FLOPS_PER_ELEMENT
from ..ops.elementwise import elementwise
from .dispatch import implements, same_device
from .kernels import dtype_of, machine, record, wrap
from .tensor import local

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
    inputs = sum(1 for a in args if isinstance(a, torch.Tensor))
    run = elementwise(MATH_OPS[base], out.numel(), inputs=inputs, dtype=dtype, elem_bytes=eb, machine=machine())
    flops = MATH_FLOPS_PER_ELEMENT[MATH_OPS[base]] * out.numel()
    record(f"aten::{name}", args, f"elementwise {MATH_OPS[base]}", run, flops)
    if name.endswith("_"):
        return args[0]
    return wrap(out)


implements(*MATH_OPS, *(f"{op}_" for op in ("add", "sub", "mul", "div")))(_handler)
