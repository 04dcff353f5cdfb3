"""mm, addmm, bmm, baddbmm, mv, dot on the ahbm device: the GEMM tile kernel
(``kbtorch.ops.gemm``).

Numerics: torch with fp32 accumulation, cast to the input dtype once (the GEMM kernel's
own numeric rule); integer inputs exactly, in their type (timed at the fp32 rate). Timing follows the placements (see ``sharding``), for ``a[M, K] @ b[K, N]``
on a mesh of P PEs:

- column-parallel, ``b`` Shard(1): every PE computes ``M x N/P x K`` from its own slice of
  ``b`` (``a`` all-gathered first if it is sharded, reduced if partial); result Shard(1);
- row-parallel, ``b`` Shard(0): every PE computes ``M x N x K/P`` from its slices of ``a``
  (a replicated ``a`` is sliced for free) and ``b``; result Partial (reduced when used);
- otherwise: one GEMM over all PEs with the automatic tiling and grid (its operand panels
  deployed as the GEMM kernel assumes); result placed by default.

Kernels are cached per shape (the simulator is deterministic). The bias of ``addmm`` and
``baddbmm`` (with ``alpha``/``beta``, honoured) is one more pass on the MATH engines;
``bmm`` runs its batch of GEMMs one after another; an empty product runs no kernel.
"""
from __future__ import annotations

from functools import partial

import torch

from ...kernel import by_fidelity
from ...ops.gemm import gemm
from ..dispatch import Out, refuse, register, same_device, value_of
from ..placement.sharding import flat, placement, settle_partial, to_all
from ..placement.spec import Partial, Replicate, Shard, Spec, default_spec, scoped_pes
from ..timing import Rows, kernel_dtype, on, timed, vector
from .matmul_mesh import mesh_matmul
from ... import state

aten = torch.ops.aten


@state.cache


@by_fidelity(256)
def _gemm(machine, m: int, n: int, k: int, dtype: str, slices: str | None = None, pes: tuple | None = None):
    """The GEMM on all PEs (``fit``: or on as many as a small shape can use), or with
    ``slices`` ("n", "k") every PE of ``pes`` multiplying its own slice of the operands
    from its HBM; simulated coarse when its traffic is large (``mode="auto"``,
    ``kernel.policy.sim_mode``: a prefill GEMM on a 36-tile maia200 chip within 0.05% of fast,
    20 x faster), else fast."""
    try:
        return gemm(shape=(m, n, k), dtype=dtype, machine=machine, pes=pes, slices=slices, fit=slices is None,
                    mode="auto")
    except ValueError as exc:
        raise NotImplementedError(f"kbtorch: no GEMM tiling for M={m} N={n} K={k} {dtype}: {exc}") from None


def _rows_result(machine, n: int, k: int, dtype: str, slices, pes, m: int):
    return _gemm(machine, m, n, k, dtype, slices, pes).result


def rows(machine, m: int, n: int, k: int, dtype: str, slices: str | None = None, pes: tuple | None = None) -> Rows:
    """The GEMM split along M (graph mode's overlap): the same call on fewer rows."""
    return Rows("gemm", m, partial(_rows_result, machine, n, k, dtype, slices, pes))


def timed_mm(machine, op: str, args, m: int, n: int, k: int, dtype: str, detail: str = ""):
    """The GEMM of ``op`` over all PEs (the scope's, ``placement.SCOPE``, while one is set;
    automatic tiling and grid), as a ``Timed`` run."""
    pes = scoped_pes(machine)
    run = _gemm(machine, m, n, k, dtype, None, pes)
    return timed(op, args, "gemm", run.result, 2 * m * n * k, detail or run.tiling.describe(),
                 rows(machine, m, n, k, dtype, None, pes))


def torch_check(func, args, kwargs) -> None:
    """Raise what CPU torch raises for this call (shapes, batch sizes, dtypes, kwargs): the
    op runs on meta tensors of the same shapes and dtypes first."""
    dtypes = list(dict.fromkeys(a.dtype for a in args if isinstance(a, torch.Tensor)))
    if len(dtypes) > 1:
        # NOTE: the meta kernels do not check this; CPU's message, in torch's words
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {dtypes[0]} != {dtypes[1]}")

    def meta(x):
        return torch.empty(x.shape, dtype=x.dtype, device="meta") if isinstance(x, torch.Tensor) else x
    func(*(meta(a) for a in args), **{k: meta(v) for k, v in kwargs.items()})


def _product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` by the GEMM's numeric rule: fp32 accumulation cast to the input dtype
    (integers: exact, in their own type)."""
    if not a.is_floating_point():
        return a @ b
    return (a.float() @ b.float()).to(a.dtype)


def _scaled(acc: torch.Tensor, bias: torch.Tensor, kwargs: dict, dtype) -> torch.Tensor:
    """``beta * bias + alpha * acc`` (``acc``: the product before rounding) as torch's
    ``addmm`` family (``beta=0``: the bias is ignored, NaNs included), rounded once."""
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    if not dtype.is_floating_point:
        beta, alpha = int(beta), int(alpha)     # NOTE: as torch converts scalars for integer types
    if alpha != 1:
        acc = acc * alpha
    if beta != 0:
        acc = acc + (bias * beta if beta != 1 else bias).to(acc.dtype)
    return acc.to(dtype)


def bias_run(machine, op: str, args, kwargs, spec, shape: tuple, dtype: str, eb: int):
    """The MATH pass of ``beta * bias + alpha * product`` (cost class ``add``; ``fma`` with
    a scale; none for a plain product, ``beta=0`` and ``alpha=1``), or None."""
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    if beta == 0 and alpha == 1:
        return None
    cls = "add" if beta == 1 and alpha == 1 else "fma"
    n = int(torch.Size(shape).numel())
    run = vector(machine, cls, n, placed=spec.uniform or Replicate(), pes=spec.mesh, shape=shape, dtype=dtype,
                 elem_bytes=eb)
    return timed(f"{op} (bias)", args, f"elementwise {cls}", run, machine.math_flops(cls) * n)


def _matmul(machine, op: str, a, b):
    """Time ``a @ b`` by the placement rules; -> (result ``Spec`` (None: default), run). A
    mixed placement on a mesh of several dimensions: ``ops_matmul_mesh``."""
    m, k, n = a.shape[0], a.shape[1], b.shape[1]
    dtype, _ = kernel_dtype(value_of(a), op)
    if hasattr(a, "_spec") and any(len(x._spec.placements) > 1 and x._spec.uniform is None for x in (a, b)):
        return mesh_matmul(machine, op, a, b, _gemm)
    pb = placement(b)
    if isinstance(pb, Shard) and hasattr(a, "_spec"):
        a, b = flat(a), flat(b)
        pes = tuple(b._spec.mesh.pes)
        if pb.dim % 2 == 1:
            a = settle_partial(a)
            if not isinstance(placement(a), Replicate):
                a = to_all(a, Replicate())
            run = _gemm(machine, m, n, k, dtype, "n", pes)
            return on(b, Shard(1)), timed(op, (a, b), "gemm", run.result, run.flops, run.plan,
                                          rows(machine, m, n, k, dtype, "n", pes))
        pa = placement(settle_partial(a))
        if isinstance(pa, Shard) and pa.dim % 2 == 1 or isinstance(pa, Replicate):
            run = _gemm(machine, m, n, k, dtype, "k", pes)
            return on(b, Partial()), timed(op, (a, b), "gemm", run.result, run.flops, run.plan,
                                           rows(machine, m, n, k, dtype, "k", pes))
    return None, timed_mm(machine, op, (a, b), m, n, k, dtype)


@register(aten.mm)
def mm(func, args, kwargs, machine):
    refuse(func, kwargs)
    same_device("mm", args)
    torch_check(func, args, kwargs)
    out = _product(value_of(args[0]), value_of(args[1]))
    if not out.numel() or not args[0].shape[1]:
        return Out(out)
    where, run = _matmul(machine, "aten::mm", args[0], args[1])
    return Out(out, where, runs=(run,))


@register(aten.mv, aten.dot, aten.vdot)
def mv(func, args, kwargs, machine):
    """``a[M, K] @ v[K]`` and ``u[K] . v[K]``: the GEMM of M x 1 x K (M = 1 for a dot)."""
    refuse(func, kwargs)
    name = func.overloadpacket.__name__
    same_device(name, args)
    a, v = value_of(args[0]), value_of(args[1])
    if name == "vdot" and a.is_complex():
        raise NotImplementedError(f"kbtorch: {func} of complex tensors on ahbm is not supported")
    m = a.shape[0] if a.dim() == 2 else 1
    out = _product(a.reshape(m, -1), v.reshape(-1, 1)).reshape((m,) if a.dim() == 2 else ())
    if not out.numel() or not v.shape[0]:
        return Out(out)
    dtype, _ = kernel_dtype(a, name)
    return Out(out, runs=(timed_mm(machine, f"aten::{name}", args, m, 1, v.shape[0], dtype),))


@register(aten.addmm)
def addmm(func, args, kwargs, machine):
    """``beta * bias + alpha * (a @ b)``: the GEMM, then the bias pass on the MATH engines
    (``bias_run``); ``alpha`` and ``beta`` are honoured in numerics and timing.

    NOTE: a bias must be added once, after the partial sums are reduced: a Partial product
    is all-reduced first (recorded as it runs, before the GEMM that the dispatcher records
    with the bias add)."""
    refuse(func, kwargs)
    same_device("addmm", args)
    torch_check(func, args, kwargs)
    bias, a, b = (value_of(x) for x in args[:3])
    out = _scaled(_product_acc(a, b), bias, kwargs, a.dtype)
    if not out.numel():
        return Out(out)
    dtype, eb = kernel_dtype(a, "addmm")
    runs, where = [], None
    if a.shape[1]:
        where, run = _matmul(machine, "aten::addmm", args[1], args[2])
        runs.append(run)
    if where is not None and any(isinstance(p, Partial) for p in where.placements):
        settled = tuple(Replicate() if isinstance(p, Partial) else p for p in where.placements)
        type(args[2])(out, where).redistribute(settled)
        where = Spec(where.mesh, settled)
    spec = where or default_spec(machine, tuple(out.shape))
    extra = bias_run(machine, "aten::addmm", args, kwargs, spec, tuple(out.shape), dtype, eb)
    return Out(out, where, runs=tuple(runs) + ((extra,) if extra else ()))


def _product_acc(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` before its final rounding (fp32 for half-precision inputs)."""
    return a.float() @ b.float() if a.dtype in (torch.float16, torch.bfloat16) else a @ b


@register(aten.bmm, aten.baddbmm)
def bmm(func, args, kwargs, machine):
    """``bmm``: a batch of GEMMs one after another; ``baddbmm`` then the bias pass."""
    refuse(func, kwargs)
    name = func.overloadpacket.__name__
    same_device(name, args)
    torch_check(func, args, kwargs)
    a, b = value_of(args[-2]), value_of(args[-1])
    acc = torch.stack([_product_acc(x, y) for x, y in zip(a, b)]) if len(a) else _product_acc(a, b)
    out = _scaled(acc, value_of(args[0]), kwargs, a.dtype) if name == "baddbmm" else acc.to(a.dtype)
    if not out.numel():
        return Out(out)
    dtype, eb = kernel_dtype(a, name)
    runs = tuple(timed_mm(machine, f"aten::{name}", args, a.shape[1], b.shape[2], a.shape[2], dtype)
                 for _ in range(a.shape[0] if a.shape[2] else 0))
    if name == "baddbmm":
        spec = default_spec(machine, tuple(out.shape))
        extra = bias_run(machine, "aten::baddbmm", args, kwargs, spec, tuple(out.shape), dtype, eb)
        runs += (extra,) if extra else ()
    return Out(out, runs=runs)
