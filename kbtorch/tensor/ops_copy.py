"""Data movement ops on the ahbm device: ``cat``, ``embedding``, ``index_select``, ``clone``
(also what ``reshape`` of a non-contiguous tensor and ``contiguous`` become).

Numerics: the torch op on the local values. Timing: a copy pass of the output's elements
through the PEs' DMA engines (HBM -> TCM -> HBM, no MATH work): concatenation and row
gathers move every output element once.
"""
from __future__ import annotations

import torch

from ..ops.elementwise import elementwise
from .dispatch import implements, same_device
from .kernels import dtype_of, machine, record, wrap
from .tensor import local


def _flat(args) -> list:
    out = []
    for a in args:
        out.extend(_flat(a) if isinstance(a, (list, tuple)) else [a])
    return out


@implements("cat", "embedding", "index_select", "clone")
def copy_pass(func, args, kwargs):
    name = func.overloadpacket.__name__
    tensors = [a for a in _flat(args) if isinstance(a, torch.Tensor)]
    same_device(name, tensors)
    unwrapped = [[local(x) for x in a] if isinstance(a, (list, tuple)) else local(a) for a in args]
    out = func(*unwrapped, **kwargs)
    dtype, eb = dtype_of(name, out)
    run = elementwise("copy", out.numel(), inputs=1, dtype=dtype, elem_bytes=eb, machine=machine(),
                      flops_per_element=0)
    record(f"aten::{name}", tensors, "copy", run, 0)
    return wrap(out)
