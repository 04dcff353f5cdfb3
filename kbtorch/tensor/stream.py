"""The stream of the ahbm device: ops run in program order, each one's kernel launched on
the simulator in turn, so the simulated clock advances op by op.

``record`` puts an ``OpRecord`` on the stream at the clock, advances the clock and hands
the record to every open listener (``listen``; ``kbtorch.profile()`` is one). The clock
and the listeners are context-local (``contextvars``): threads and async tasks each have
their own. Reports of the records (tables, traces) are ``kbtorch.profiler``'s.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from .. import state
from ..ops.contract import bottleneck, memory_bytes, tflops
from ..topology.kinds import kind_name


@dataclass(frozen=True)
class OpRecord:
    """One op on the ahbm device: what ran, when (simulated ns) and what it cost;
    ``bottleneck`` is the friendly name of the component kind holding most of it."""

    name: str
    shapes: tuple
    kernel: str
    start_ns: float
    latency_ns: float
    flops: int = 0
    bytes: int = 0
    bottleneck: str = ""
    detail: str = ""
    usage: tuple = ()
    timeline: dict | None = field(default=None, compare=False, repr=False)
    parts: tuple = field(default=(), compare=False, repr=False)     # a graph's kernels (start_ns: from its start)
    track: str = ""         # the trace track of an op of a pipeline stage (``TRACK``); "": its kernel's
    module: str = ""        # the outermost ``nn.Module`` class whose call ran it; "": none (host code)
    obtained: object = field(default=None, compare=False, repr=False)   # how its run was (``kernel.steady.Obtained``)

    @property
    def tflops(self) -> float:
        return tflops(self.flops, self.latency_ns)

    @property
    def gbps(self) -> float:
        return self.bytes / self.latency_ns if self.latency_ns else 0.0


# NOTE: immutable values in the context variables (a float, a tuple): a task that copies the
# context advances its own clock and never another's.
_CLOCK_NS: ContextVar = state.context_var("kbtorch_clock_ns", 0.0)
_LISTENERS: ContextVar = state.context_var("kbtorch_profiles", ())
#: The trace track of the ops recorded while it is set (a pipeline stage, ``tensor.pipeline``).
TRACK: ContextVar = state.context_var("kbtorch_track", "")


def clock_ns() -> float:
    """The stream's simulated clock (ns) in this context."""
    return _CLOCK_NS.get()


def set_clock_ns(ns: float) -> None:
    """Move this context's clock (a pipeline stage's stream starting where that stage is
    free, ``tensor.pipeline``)."""
    _CLOCK_NS.set(ns)


def record(name: str, shapes: tuple, kernel: str, latency_ns: float, **kw) -> OpRecord:
    """Put an op on this context's stream: it starts at the clock, which it advances; with a
    listener open, the record names the module whose call ran it (``module_scope``)."""
    kw.setdefault("track", TRACK.get())
    if _LISTENERS.get():
        kw.setdefault("module", module_scope())
    rec = OpRecord(name, shapes, kernel, _CLOCK_NS.get(), latency_ns, **kw)
    _CLOCK_NS.set(rec.start_ns + latency_ns)
    for listener in _LISTENERS.get():
        listener.append(rec)
    return rec


_MODULE_CALLS = (torch.nn.Module._wrapped_call_impl.__code__, torch.nn.Module._call_impl.__code__)


def module_scope() -> str:
    """The class name of the outermost ``nn.Module`` being called on this thread's Python
    stack, or "" when none is: an op of a model's forward (``model(...)``, also compiled or
    graphed) against one of the host code around it (generate()'s bookkeeping)."""
    # NOTE: the stack, not module hooks: global hooks would change what dynamo traces, and
    # a model called any way (``__call__``, compiled, graphed) passes ``Module._wrapped_call_impl``.
    frame, found = sys._getframe(1), ""
    while frame is not None:
        if frame.f_code in _MODULE_CALLS:
            module = frame.f_locals.get("self")
            found = type(getattr(module, "_orig_mod", module)).__name__     # a compiled module: its model
        frame = frame.f_back
    return found


@contextmanager
def listen(records: list):
    """Append every op recorded in this context to ``records`` while the block runs."""
    token = _LISTENERS.set(_LISTENERS.get() + (records,))
    try:
        yield records
    finally:
        _LISTENERS.reset(token)


def usage(result) -> tuple:
    """(track, busy fraction) of a run: each engine role (mean over the PEs that used it)
    and each link kind (its busiest link), over the run's latency."""
    span = result.latency_ps or 1
    pes = max(1, len(result.pe_finish_ps))
    out = [(f"engine {role}", e["busy_ps"] / span / pes) for role, e in sorted(result.stats["engines"].items())]
    out += [(f"links {kind}", link["max_busy_ps"] / span) for kind, link in sorted(result.stats["links"].items())]
    return tuple((track, round(min(1.0, f), 4)) for track, f in out)


_SUMMARIES: dict = state.cache({}, "kbtorch.tensor.stream._SUMMARIES")
SUMMARIES_MAX = 4096        # NOTE: a cache size, not hardware


def summary(machine, r) -> tuple:
    """(bytes, bottleneck, usage) of a run, computed once per run object.

    NOTE: cached kernels hand out the same run for every op of a shape, and these walk every
    memory and the attribution chain; the entry keeps its run, so an id is never reused."""
    got = _SUMMARIES.get(id(r))
    if got is None or got[0] is not r:
        got = _SUMMARIES[id(r)] = (r, (memory_bytes(machine, r, None), kind_name(bottleneck(r)), usage(r)))
        if len(_SUMMARIES) > SUMMARIES_MAX:
            del _SUMMARIES[next(iter(_SUMMARIES))]
    return got[1]


def tracing() -> bool:
    """Whether torch.compile is tracing (its fake values run through the handlers to learn
    the results' shapes): nothing runs on the device then, nothing is recorded."""
    return torch._guards.TracingContext.try_get() is not None


#: The graph being captured in this context (``tensor.graph``), or None: the stream.
CAPTURE: ContextVar = state.context_var("kbtorch_capture", None)


def record_run(machine, run) -> OpRecord | None:
    """Put a kernel an op ran (a ``kernels.Timed``) on the stream, with the bytes its
    memories served, its bottleneck and how busy its engines and links were; or into the
    graph being captured (``tensor.graph``), which times it later beside the others."""
    if tracing():
        return None
    graph = CAPTURE.get()
    if graph is not None:
        return graph.kernel(machine, run)
    r = run.result
    nbytes, neck, use = summary(machine, r)
    return record(run.name, run.shapes, run.kernel, r.latency_ns, flops=run.flops, bytes=nbytes,
                  bottleneck=neck, detail=run.detail, usage=use, timeline=r.timeline or None, obtained=r.obtained)
