"""``F.scaled_dot_product_attention`` on the ahbm device: a correct but explicitly slow
fallback until the fused attention kernel exists.

Numerics: torch's SDPA on the local values. Timing: the unfused sequence, one head after
another: ``Q @ K^T`` (a GEMM of L x S x E per batch and head), softmax over the scores (a
vector pass; the causal mask costs nothing extra), ``P @ V`` (L x E x S). Every step is its
own op record named ``sdpa fallback: ...``, so the profiler shows it for what it is.
"""
from __future__ import annotations

import torch.nn.functional as F

from .dispatch import same_device
from .kernels import vector, dtype_of, record, wrap
from .ops_matmul import timed_mm
from .tensor import AhbmTensor, local


def sdpa_fallback(args, kwargs) -> AhbmTensor:
    q, k, v = args[:3]
    same_device("scaled_dot_product_attention", [q, k, v])
    out = F.scaled_dot_product_attention(*(local(a) for a in args), **{n: local(x) for n, x in kwargs.items()})
    dtype, eb = dtype_of("scaled_dot_product_attention", local(q))
    *batch, length, e = q.shape
    s, ev = k.shape[-2], v.shape[-1]
    heads = 1
    for d in batch:
        heads *= d
    for _ in range(heads):
        timed_mm("sdpa fallback: q @ k^T", (q, k), length, s, e, dtype, "unfused fallback (explicitly slow)")
    run = vector("softmax", heads * length * s, inputs=1, dtype=dtype, elem_bytes=eb,
                      flops_per_element=8)
    record("sdpa fallback: softmax", (q, k), "vector softmax", run, 8 * heads * length * s,
           "unfused fallback (explicitly slow)")
    for _ in range(heads):
        timed_mm("sdpa fallback: p @ v", (q, v), length, ev, s, dtype, "unfused fallback (explicitly slow)")
    return wrap(out)
