"""Shared helpers of the op handlers: the machine, dtypes, wrapping and run summaries."""
from __future__ import annotations

from functools import lru_cache

import torch

from ..ops.elementwise import elementwise
from ..profiler import kind_name
from ..topology import load_machine
from .stream import STREAM

DTYPES = {torch.float16: ("f16", 2), torch.bfloat16: ("bf16", 2), torch.float32: ("fp32", 4)}


@lru_cache(maxsize=1)
def machine():
    """The AHBM machine the device models (compiled once)."""
    return load_machine("ahbm")


def vector(op: str, numel: int, *, placed=None, pes=None, shape=None, inputs: int = 2, dtype: str = "f16",
           elem_bytes: int = 2, flops_per_element: int | None = None, out_ratio: float = 1.0):
    """The vector MATH kernel (``ops.elementwise``) for a result of ``numel`` elements on the
    PEs ``pes`` (default: all): split over the PEs that hold a part when ``placed`` is a
    ``Shard`` (at most ``shape[dim]`` of them), else all of it on every PE (replicated:
    redundant work, no communication)."""
    from .placement import Shard
    pes = tuple(range(len(machine().pes)) if pes is None else pes)
    if isinstance(placed, Shard):
        if shape:
            pes = pes[:max(1, min(len(pes), shape[placed.dim % len(shape)]))]
        n = numel
    else:
        n = numel * len(pes)
    return _vector(op, max(1, n), pes, inputs, dtype, elem_bytes, flops_per_element, out_ratio)


@lru_cache(maxsize=1024)
def _vector(op, n, pes, inputs, dtype, elem_bytes, flops_per_element, out_ratio):
    # NOTE: cached: the simulator is deterministic, so a layer repeated 28 times is simulated once.
    return elementwise(op, n, inputs=inputs, dtype=dtype, elem_bytes=elem_bytes, machine=machine(), pes=pes,
                       flops_per_element=flops_per_element, out_ratio=out_ratio).result


def mesh_pes(x) -> tuple | None:
    """The PEs of an ahbm tensor's mesh (None for anything else)."""
    spec = getattr(x, "_spec", None)
    return tuple(spec.mesh.pes) if spec is not None else None


def wrap(out: torch.Tensor, placement=None, like=None):
    """An op's result as a new ahbm tensor: with ``placement`` on the (flattened) mesh of
    ``like``, or placed by default for its shape."""
    from .placement import Mesh, Spec
    from .tensor import AhbmTensor, default_spec
    if placement is None or not hasattr(like, "_spec"):
        return AhbmTensor(out, default_spec(len(machine().pes), tuple(out.shape)))
    pes = like._spec.mesh.pes
    return AhbmTensor(out, Spec(Mesh(pes, (len(pes),)), (placement,)))


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
                         bottleneck=bottleneck(result), detail=detail, usage=usage(result),
                         timeline=result.timeline or None)
