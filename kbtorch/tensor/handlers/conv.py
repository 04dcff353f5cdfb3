"""``aten.convolution`` (forward, any number of spatial dimensions; ``nn.Conv1d`` of Mamba,
Jamba and FalconMamba, ``nn.Conv2d``) on the ahbm device.

Numerics: torch on the host values. Timing, by the convolution's grouping:

- ``groups == 1``: one GEMM, as im2col lowers it: ``M`` = batch x output positions, ``N`` =
  output channels, ``K`` = input channels x kernel taps (the GEMM kernel, automatic tiling);
  a bias is one more MATH pass (``add``);
- depthwise (``groups`` = input channels, ``C_out`` a multiple of it: the causal
  ``Conv1d`` of a Mamba block): one vector pass over the output, ``taps`` fused
  multiply-adds per element (the machine's ``fma`` cost x taps, one more ``add`` with a
  bias), streaming the input; the result keeps the input's placement when it is sharded
  on the batch or the channels (each PE convolves its own rows), else the input is
  gathered first (timed);
- any other grouping: refused, naming it.

NOTE: the depthwise pass reads each input element once per output (a sliding window held in
TCM: the taps are a few elements, ``kernel_size - 1`` of halo per row); padding is in the
output's count. A transposed convolution is refused.
"""
from __future__ import annotations

from math import prod

import torch

from ..dispatch import Out, host_call, refuse, register, same_device, value_of
from ..placement.sharding import flat, placement, settle_partial, shard_dim, to_all
from ..placement.spec import Replicate, default_spec
from ..timing import kernel_dtype, mesh_of, on, timed, vector
from .matmul import bias_run, timed_mm

aten = torch.ops.aten


def _grouping(x, weight, groups: int, transposed: bool) -> str:
    if transposed:
        raise NotImplementedError("kbtorch: aten.convolution with transposed=True is not supported on ahbm "
                                  "(a transposed convolution has no tile kernel)")
    c_in, c_out = x.shape[1], weight.shape[0]
    if groups == 1:
        return "gemm"
    if groups == c_in and c_out % c_in == 0:
        return "depthwise"
    raise NotImplementedError(f"kbtorch: aten.convolution with groups={groups} over {c_in} input channels is not "
                              f"supported on ahbm (groups=1 or depthwise, groups = input channels)")


@register(aten.convolution.default)
def convolution(func, args, kwargs, machine):
    refuse(func, kwargs)
    same_device("convolution", (args, kwargs))
    x, weight, bias = args[0], args[1], args[2]
    kind = _grouping(x, weight, args[8], args[6])
    out = host_call(func, args, kwargs)
    if not out.numel():
        return Out(out)
    dtype, eb = kernel_dtype(value_of(x), "convolution")
    taps = prod(weight.shape[2:])
    if kind == "gemm":
        m, n, k = out.numel() // out.shape[1], out.shape[1], weight.shape[1] * taps
        runs = [timed_mm(machine, "aten::convolution", (x, weight), m, n, k, dtype, f"im2col GEMM {m}x{n}x{k}")]
        spec = default_spec(machine, tuple(out.shape))
        if bias is not None:
            runs.append(bias_run(machine, "aten::convolution", args, {}, spec, tuple(out.shape), dtype, eb))
        return Out(out, spec, runs=tuple(runs))
    return _depthwise(machine, x, bias, out, taps, dtype, eb)


def _depthwise(machine, x, bias, out, taps: int, dtype: str, eb: int) -> Out:
    """The vector pass of a depthwise convolution (module docstring)."""
    x = settle_partial(flat(x))
    if shard_dim(x) not in (None, 0, 1):
        x = to_all(x, Replicate())
    placed = placement(x)
    flops = machine.math_flops("fma") * taps + (machine.math_flops("add") if bias is not None else 0)
    run = vector(machine, "fma", out.numel(), placed=placed, pes=mesh_of(x), shape=tuple(out.shape), inputs=1,
                 dtype=dtype, elem_bytes=eb, flops_per_element=flops)
    return Out(out, on(x, placed), runs=(timed("aten::convolution", (x,), "elementwise fma", run, flops * out.numel(),
                                               f"depthwise, {taps} taps"),))
