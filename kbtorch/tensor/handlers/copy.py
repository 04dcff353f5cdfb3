"""Data movement ops on the ahbm device: ``cat``, ``embedding``, ``index_select``, ``clone``
(also what ``reshape`` of a non-contiguous tensor and ``contiguous`` become), dtype casts
(``.to(dtype)``) and copies between ahbm tensors (``copy_``, e.g. a KV cache update).

Numerics: the torch op on the host values. Timing: a copy pass of each PE's part of the
output through its DMA engines (HBM -> TCM -> HBM, no MATH work): concatenation and row
gathers move every output element once. A vocabulary-sharded embedding gives a Partial
result (each PE looks up the rows it holds); a Partial tensor cast to a wider dtype is
reduced first, at its own dtype (``to_copy``). A copy from the host (``copy_`` of a CPU
tensor, ``.to("ahbm")``) is the untimed deployment.
"""
from __future__ import annotations

import torch

from ..dispatch import Out, is_ahbm, register, same_device, value_of
from ..placement.sharding import elementwise_inputs, placement, settle_partial
from ..placement.spec import Partial, Shard
from ..timing import kernel_dtype, mesh_of, on, timed, vector
from .meta import off_device

aten = torch.ops.aten


def _flat(args) -> list:
    out = []
    for a in args:
        out.extend(_flat(a) if isinstance(a, (list, tuple)) else [a])
    return out


def timed_copy(machine, op: str, tensors, out: torch.Tensor, placed):
    """The copy pass of ``out`` (placed by ``placed``) on the PEs of the first ahbm tensor."""
    dtype, eb = kernel_dtype(out, op)
    pes = next((mesh_of(t) for t in tensors if mesh_of(t)), None)
    run = vector(machine, "copy", out.numel(), placed=placed, pes=pes, shape=tuple(out.shape), inputs=1,
                 dtype=dtype, elem_bytes=eb, flops_per_element=0)
    return timed(f"aten::{op}", tensors, "copy", run, 0)


@register(aten.cat, aten.embedding, aten.index_select, aten.clone)
def copy_pass(func, args, kwargs, machine):
    name = func.overloadpacket.__name__
    tensors = [a for a in _flat(args) if isinstance(a, torch.Tensor)]
    same_device(name, tensors)
    unwrapped = [[value_of(x) for x in a] if isinstance(a, (list, tuple)) else value_of(a) for a in args]
    out = func(*unwrapped, **kwargs)
    ahbm = [t for t in tensors if is_ahbm(t)]
    if name == "embedding":
        placed = Partial() if isinstance(placement(args[0]), Shard) else None
    elif name == "index_select":
        placed = None
    else:
        placed = elementwise_inputs(ahbm, tuple(out.shape))[1]
    run = timed_copy(machine, name, tensors, out, placed)
    return Out(out, None if placed is None else on(ahbm[0], placed), runs=(run,))


@register(aten.copy_)
def copy_into(func, args, kwargs, machine):
    """``dst.copy_(src)``: timed when ``src`` is on ahbm, else the host's deployment."""
    dst, src = args[0], args[1]
    func(value_of(dst), value_of(src), *args[2:], **kwargs)
    if is_ahbm(src):
        return Out(dst, runs=(timed_copy(machine, "copy_", (dst, src), value_of(src), placement(dst)),))
    return dst


@register(aten._to_copy)
def to_copy(func, args, kwargs, machine):
    """``.to(dtype)`` on the device: a timed cast pass that keeps the input's placement, but
    a ``Partial`` input cast to a wider dtype is reduced first (``settle_partial``) and the
    result takes the settled placement. A copy to another device returns a plain tensor there
    (``ops_meta.off_device``).

    NOTE: a tensor-parallel kernel reduces partial sums at the dtype they were made in: kept
    Partial, the cast (e.g. HF's RMSNorm ``.to(float32)`` of a vocabulary-sharded
    embedding) would make the later reduction move twice the bytes. The value is the global
    one either way. A sharded input stays sharded: the cast is elementwise, and whether a
    gather follows (and would be cheaper at the narrow dtype) is the next op's business."""
    moved = off_device(func, args, kwargs)
    if moved is not None:
        return moved
    x = args[0]
    if kwargs.get("device") is not None:
        kwargs = dict(kwargs, device=value_of(x).device)
    out = func(value_of(x), *args[1:], **kwargs)
    if isinstance(placement(x), Partial) and out.element_size() > value_of(x).element_size():
        x = settle_partial(x, tuple(out.shape))
    return Out(out, x._spec, runs=(timed_copy(machine, "_to_copy", (x,), out, placement(x)),))
