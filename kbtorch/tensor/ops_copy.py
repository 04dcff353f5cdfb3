"""Data movement ops on the ahbm device: ``cat``, ``embedding``, ``index_select``, ``clone``
(also what ``reshape`` of a non-contiguous tensor and ``contiguous`` become), dtype casts
(``.to(dtype)``) and copies between ahbm tensors (``copy_``, e.g. a KV cache update).

Numerics: the torch op on the local values. Timing: a copy pass of each PE's part of the
output through its DMA engines (HBM -> TCM -> HBM, no MATH work): concatenation and row
gathers move every output element once. A vocabulary-sharded embedding gives a Partial
result (each PE looks up the rows it holds). A copy from the host (``copy_`` of a CPU
tensor, ``.to("ahbm")``) is the untimed deployment.
"""
from __future__ import annotations

import torch

from .dispatch import implements, same_device
from .kernels import dtype_of, mesh_pes, record, vector, wrap
from .placement import Partial, Shard
from .sharding import elementwise_inputs, placement
from .tensor import DEVICE, AhbmTensor, local


def _flat(args) -> list:
    out = []
    for a in args:
        out.extend(_flat(a) if isinstance(a, (list, tuple)) else [a])
    return out


def timed_copy(op: str, tensors, out: torch.Tensor, placed) -> None:
    dtype, eb = dtype_of(op, out)
    pes = next((mesh_pes(t) for t in tensors if mesh_pes(t)), None)
    run = vector("copy", out.numel(), placed=placed, pes=pes, shape=tuple(out.shape), inputs=1, dtype=dtype,
                 elem_bytes=eb, flops_per_element=0)
    record(f"aten::{op}", tensors, "copy", run, 0)


@implements("cat", "embedding", "index_select", "clone")
def copy_pass(func, args, kwargs):
    name = func.overloadpacket.__name__
    tensors = [a for a in _flat(args) if isinstance(a, torch.Tensor)]
    same_device(name, tensors)
    unwrapped = [[local(x) for x in a] if isinstance(a, (list, tuple)) else local(a) for a in args]
    out = func(*unwrapped, **kwargs)
    ahbm = [t for t in tensors if isinstance(t, AhbmTensor)]
    if name == "embedding":
        placed = Partial() if isinstance(placement(args[0]), Shard) else None
    elif name == "index_select":
        placed = None
    else:
        placed = elementwise_inputs(ahbm, tuple(out.shape))[1]
    timed_copy(name, tensors, out, placed)
    return wrap(out, placed, like=ahbm[0])


@implements("copy_")
def copy_into(func, args, kwargs):
    """``dst.copy_(src)``: timed when ``src`` is on ahbm, else the host's deployment."""
    dst, src = args[0], args[1]
    func(local(dst), local(src), *args[2:], **kwargs)
    if isinstance(src, AhbmTensor):
        timed_copy("copy_", (dst, src), local(src), placement(dst))
    return dst


@implements("_to_copy")
def to_copy(func, args, kwargs):
    """``.to(dtype)`` on the device: a timed cast pass (moves to other devices are handled
    before dispatch reaches handlers)."""
    x = args[0]
    device = kwargs.get("device")
    if device is not None:
        kwargs = dict(kwargs, device=local(x).device)
    out = func(local(x), *args[1:], **kwargs)
    if device is not None and torch.device(device).type != DEVICE:
        return out
    timed_copy("_to_copy", (x,), out, placement(x))
    return AhbmTensor(out, x._spec)
