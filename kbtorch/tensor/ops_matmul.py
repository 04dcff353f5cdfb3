"""mm, addmm, bmm on the ahbm device: the GEMM tile kernel (``kbtorch.ops.gemm``).

Numerics: torch with fp32 accumulation, cast to the input dtype (the GEMM kernel's own
numeric rule). Timing: a timing-only GEMM of the same shape on all PEs with the automatic
tiling, cached per (M, N, K, dtype); ``addmm``'s bias is one more elementwise add on the
MATH engines; ``bmm`` runs its batch of GEMMs one after another.
"""
from __future__ import annotations

from functools import lru_cache

import torch

from ..ops.elementwise import elementwise
from ..ops.gemm import gemm
from .dispatch import implements, same_device
from .kernels import dtype_of, machine, record, wrap
from .tensor import local


@lru_cache(maxsize=256)
def _gemm(m: int, n: int, k: int, dtype: str):
    """The GEMM on all PEs, or on the largest of 64, 16, 4, 1 PEs that a small shape can use."""
    total = len(machine().pes)
    for count in (total, 64, 16, 4, 1):
        try:
            return gemm(shape=(m, n, k), dtype=dtype, pes=range(min(count, total)), machine=machine())
        except ValueError as exc:
            error = exc
    raise NotImplementedError(f"kbtorch: no GEMM tiling for M={m} N={n} K={k} {dtype}: {error}")


def timed_mm(op: str, args, m: int, n: int, k: int, dtype: str, detail: str = ""):
    run = _gemm(m, n, k, dtype)
    record(op, args, "gemm", run.result, 2 * m * n * k, detail or run.tiling.describe())


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() @ b.float()).to(a.dtype)


@implements("mm")
def mm(func, args, kwargs):
    same_device("mm", args)
    a, b = local(args[0]), local(args[1])
    out = _product(a, b)
    dtype, _ = dtype_of("mm", a)
    timed_mm("aten::mm", args, a.shape[0], b.shape[1], a.shape[1], dtype)
    return wrap(out)


@implements("addmm")
def addmm(func, args, kwargs):
    same_device("addmm", args)
    bias, a, b = (local(x) for x in args[:3])
    out = (_product(a, b).float() + bias.float()).to(a.dtype)
    dtype, eb = dtype_of("addmm", a)
    m, n, k = a.shape[0], b.shape[1], a.shape[1]
    timed_mm("aten::addmm", args, m, n, k, dtype)
    run = elementwise("add", m * n, dtype=dtype, elem_bytes=eb, machine=machine())
    record("aten::addmm (bias)", args, "elementwise add", run, m * n)
    return wrap(out)


@implements("bmm")
def bmm(func, args, kwargs):
    same_device("bmm", args)
    a, b = local(args[0]), local(args[1])
    out = torch.stack([_product(x, y) for x, y in zip(a, b)])
    dtype, _ = dtype_of("bmm", a)
    for _ in range(a.shape[0]):
        timed_mm("aten::bmm", args, a.shape[1], b.shape[2], a.shape[2], dtype)
    return wrap(out)
