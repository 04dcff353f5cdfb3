"""``F.scaled_dot_product_attention`` on the ahbm device: the fused attention kernel
(``kbtorch.ops.attention``: FlashAttention-style prefill, split-KV decode with on-PE merges).

Numerics: torch's SDPA on the host values. Timing: the kernel, timing-only, on all PEs for
the call's (B, Hq, Hkv, Lq, Lk, D, causal, dtype), cached per shape. Inputs of three
dimensions are taken as a batch of one. With an ``attn_mask`` (padding, a StaticCache's
unfilled slots) the kernel runs over all Lk keys and the mask costs one more pass: a
``select`` vector pass over the mask's own elements, recorded as ``aten::scaled_dot_product_attention
(mask)`` (NOTE: the kernel does not stream masks; a kernel that did would read the same
bytes inside the attention pass). A call the kernel does not cover (dropout, a head
dimension or dtype it rejects) runs the correct but explicitly slow unfused fallback:
``Q K^T`` GEMMs per head, a softmax pass, ``P V`` GEMMs, each recorded as ``sdpa fallback: ...``.

NOTE: the result is placed by default for its shape; the kernel's deploy (each PE holds the
Q rows and K/V of its work items) is taken as given, like the GEMM's (see docs/model.md).
"""
from __future__ import annotations

from math import prod

import torch
import torch.nn.functional as F

from ...kernel import by_fidelity
from ...ops.attention import attention
from ..dispatch import Out, host_call, register, same_device, value_of
from ..placement.spec import Shard, scoped_pes
from ..timing import kernel_dtype, mesh_of, timed, vector
from .matmul import timed_mm
from ... import state

NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


@state.cache


@by_fidelity(128)
def _fused(machine, shape: tuple, causal: bool, scale, dtype: str, pes: tuple | None = None):
    return attention(shape=shape, is_causal=causal, scale=scale, dtype=dtype, machine=machine,
                     pes=list(pes) if pes else None)


@register(torch.ops.aten.scaled_dot_product_attention)
def sdpa(func, args, kwargs, machine):
    """SDPA on ahbm tensors: the fused kernel, or the explicit fallback."""
    call = dict(zip(NAMES, args), **kwargs)
    q, k, v = call["query"], call["key"], call["value"]
    same_device("scaled_dot_product_attention", [q, k, v] + [m for m in (call.get("attn_mask"),) if m is not None])
    out = host_call(F.scaled_dot_product_attention, args, kwargs)
    dtype, eb = kernel_dtype(value_of(q), "scaled_dot_product_attention")
    mask = call.get("attn_mask")
    if call.get("dropout_p", 0.0) or q.dim() not in (3, 4):
        return Out(out, runs=_fallback(machine, q, k, v, dtype, eb))
    lead = (1,) if q.dim() == 3 else tuple(q.shape[:1])
    shape = (*lead, q.shape[-3], k.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1])
    try:
        run = _fused(machine, shape, bool(call.get("is_causal", False)), call.get("scale"), dtype, scoped_pes(machine))
    except ValueError:
        return Out(out, runs=_fallback(machine, q, k, v, dtype, eb))
    runs = (timed("aten::scaled_dot_product_attention", (q, k, v), f"attention {run.kind}", run.result, run.flops,
                  run.plan),)
    return Out(out, runs=runs + (_mask_pass(machine, q, mask),) if mask is not None else runs)


def _mask_pass(machine, q, mask):
    """The mask's pass: a ``select`` over its elements, split over the PEs of ``q``'s mesh."""
    dtype, eb = kernel_dtype(value_of(mask), "scaled_dot_product_attention")
    n = mask.numel()
    run = vector(machine, "select", n, placed=Shard(0), pes=mesh_of(q), shape=(n,), inputs=1, dtype=dtype,
                 elem_bytes=eb)
    return timed("aten::scaled_dot_product_attention (mask)", (mask,), "elementwise select", run,
                 machine.math_flops("select") * n)


def _fallback(machine, q, k, v, dtype: str, eb: int) -> tuple:
    *batch, length, e = q.shape
    s, ev = k.shape[-2], v.shape[-1]
    heads = prod(batch)
    note = "unfused fallback (explicitly slow)"
    scores = tuple(timed_mm(machine, "sdpa fallback: q @ k^T", (q, k), length, s, e, dtype, note) for _ in range(heads))
    run = vector(machine, "softmax", heads * length * s, placed=Shard(0), inputs=1, dtype=dtype, elem_bytes=eb)
    softmax = timed("sdpa fallback: softmax", (q, k), "vector softmax", run,
                    machine.math_flops("softmax") * heads * length * s, note)
    mixes = tuple(timed_mm(machine, "sdpa fallback: p @ v", (q, v), length, ev, s, dtype, note) for _ in range(heads))
    return (*scores, softmax, *mixes)
