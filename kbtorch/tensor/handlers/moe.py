"""Mixture-of-experts routing and expert GEMMs on the ahbm device: counting (``histc``,
``bincount``) and the grouped GEMM (``_grouped_mm``: ``torch.nn.functional.grouped_mm``),
what Hugging Face's experts dispatch to (transformers 5.x ``experts_implementation =
"grouped_mm"``, the default of Qwen3-MoE, OLMoE, DeepSeek-V3, ...: sort the routed
token-expert pairs by expert, count them per expert with ``histc``, one grouped GEMM for
gate/up and one for down). The routing's gathers, scatters (``scatter_add``) and sorts are
in ``ops_index`` and ``ops_reduce``.

Numerics: the torch op on the host values (as CPU computes it); ``histc`` of integers (what
transformers passes on a device other than CPU, which CUDA counts) counts exactly in
float64 and returns the input's integer type, as CUDA does.

Timing:
- ``histc``, ``bincount``: one vector pass of the cost class ``reduce`` (a compare and an
  add per element) over the input, all-gathered first if sharded; the counts replicated.
- ``_grouped_mm`` of ``a[S, K]``, rows grouped by ``offs`` (each group's cumulative end
  row), and ``b[G, K, N]``: one GEMM ``m_g x N x K`` per group with rows, one after another
  over all PEs (the GEMM family's automatic tiling, as ``bmm``); a group without rows runs
  nothing, so only routed experts' weights are read. ``a[G, M, K] @ b[G, K, N]`` (no
  ``offs``) is G GEMMs the same way.

NOTE: a fused grouped-GEMM kernel launches once and may overlap groups; the groups one
after another bound it from above by a launch per active expert (in decode an expert's
GEMM is bound by reading its weights, which the order does not change).
NOTE: timing-only with meta offsets (unknown counts): the rows spread evenly over the
groups, as a balanced router sends them (``ops_reduce.spread`` for the router's top-k).
"""
from __future__ import annotations

import torch

from ..dispatch import HOST_VALUES, Out, host_call, refuse, register, same_device, value_of
from ..placement.sharding import placement, rowwise_input
from ..placement.spec import Replicate
from ..timing import kernel_dtype, mesh_of, on, timed, vector
from .matmul import timed_mm

aten = torch.ops.aten


def histc_value(func, args, kwargs):
    """``histc`` of integers (what CUDA computes, CPU refuses): counted in float64."""
    x = value_of(args[0])
    if x.is_floating_point():
        return host_call(func, args, kwargs)
    return host_call(func, (x.double(), *args[1:]), kwargs).to(x.dtype)


HOST_VALUES[aten.histc] = histc_value


@register(aten.histc, aten.bincount)
def count(func, args, kwargs, machine):
    """Counts per bin: one ``reduce`` pass over the input's elements."""
    name = func.overloadpacket.__name__
    refuse(func, kwargs)
    same_device(name, (args, kwargs))
    x = args[0]
    out = HOST_VALUES.get(func.overloadpacket, host_call)(func, args, kwargs)
    n = x.numel()
    if not n:
        return Out(out, on(x, Replicate()))
    src = rowwise_input(x, tuple(range(x.dim())))
    dtype, eb = kernel_dtype(value_of(x), name)
    run = vector(machine, "reduce", n, placed=placement(src), pes=mesh_of(src), shape=tuple(src.shape), inputs=1,
                 dtype=dtype, elem_bytes=eb, out_ratio=max(1, out.numel()) / n)
    return Out(out, on(x, Replicate()), runs=(timed(f"aten::{name}", args, "vector reduce", run,
                                                    machine.math_flops("reduce") * n),))


def group_rows(offs, rows: int, groups: int) -> list:
    """Rows of each group from ``offs`` (cumulative ends; rows past the last end belong to
    no group); meta offsets (timing-only): ``rows`` spread evenly over the groups."""
    if offs is None:
        return [rows] * groups
    ends = value_of(offs)
    if ends.is_meta:
        return [rows // groups + (g < rows % groups) for g in range(groups)]
    ends = [min(int(e), rows) for e in ends.tolist()]
    return [e - s for s, e in zip([0] + ends[:-1], ends)]


@register(aten._grouped_mm)
def grouped_mm(func, args, kwargs, machine):
    """One GEMM per group with rows (module docstring)."""
    refuse(func, kwargs, ("out", "bias"))
    names = [a.name for a in func._schema.arguments]
    given = dict(zip(names, args), **kwargs)
    if given.get("bias") is not None:
        raise NotImplementedError(f"kbtorch: {func} with 'bias=' on ahbm tensors is not supported")
    a, b, offs = given["self"], given["mat2"], given.get("offs")
    same_device("_grouped_mm", (a, b))
    if not (a.dim() == 2 and b.dim() == 3 and offs is not None) and not (a.dim() == 3 and b.dim() == 3 and offs is None):
        raise NotImplementedError(f"kbtorch: {func} of a {a.dim()}-D and a {b.dim()}-D operand"
                                  f"{' with' if offs is not None else ' without'} offs on ahbm is not supported "
                                  f"(2-D x 3-D with offs, or 3-D x 3-D without)")
    out = host_call(func, args, kwargs)
    groups, k, n = b.shape
    rows = group_rows(offs, a.shape[0] if a.dim() == 2 else a.shape[1], groups)
    if a.dim() == 3:
        rows = [a.shape[1]] * groups
    dtype, _ = kernel_dtype(value_of(b), "_grouped_mm")
    runs = tuple(timed_mm(machine, "aten::_grouped_mm", (a, b), m, n, k, dtype, f"group {g}: {m}x{n}x{k}")
                 for g, m in enumerate(rows) if m and k and n)
    return Out(out, runs=runs)
