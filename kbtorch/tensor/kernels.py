"""Shared helpers of the op handlers: the machine, dtypes, wrapping and run summaries."""
from __future__ import annotations

import torch

from ..profiler import kind_name
from ..topology import load_machine
from .stream import STREAM

DTYPES = {torch.float16: ("f16", 2), torch.bfloat16: ("bf16", 2), torch.float32: ("fp32", 4)}


def machine():
    return load_machine("ahbm")


def wrap(out: torch.Tensor):
    """An op's result as a new ahbm tensor, placed by default for its shape."""
    from .tensor import AhbmTensor, default_spec
    return AhbmTensor(out, default_spec(len(machine().pes), tuple(out.shape)))


def dtype_of(op: str, t: torch.Tensor) -> tuple[str, int]:
    if t.dtype not in DTYPES:
        raise NotImplementedError(f"kbtorch: {op} on ahbm tensors of dtype {t.dtype} is not supported "
                                  f"(f16, bf16, fp32)")
    return DTYPES[t.dtype]


def bottleneck(result) -> str:
    """The component kind holding most of a run's latency."""
    parts = result.breakdown()
    return kind_name(max(parts, key=lambda k: (parts[k], k))) if parts else ""


def hbm_bytes(result) -> int:
    return sum(s["bursts"] for s in result.stats["memories"].values()) * machine().flit_bytes


def usage(result) -> tuple:
    """(track, busy fraction) of a run: each engine role (mean over the PEs that used it)
    and each link kind (its busiest link), over the run's latency."""
    span = result.latency_ps or 1
    pes = max(1, len(result.pe_finish_ps))
    out = [(f"engine {role}", e["busy_ps"] / span / pes) for role, e in sorted(result.stats["engines"].items())]
    out += [(f"links {kind}", link["max_busy_ps"] / span) for kind, link in sorted(result.stats["links"].items())]
    return tuple((track, round(min(1.0, f), 4)) for track, f in out)


def record(op: str, args, kernel: str, result, flops: int, detail: str = ""):
    shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))
    return STREAM.record(op, shapes, kernel, result.latency_ns, flops=flops, bytes=hbm_bytes(result),
                         bottleneck=bottleneck(result), detail=detail, usage=usage(result))
