"""Stream semantics: ops run in program order, each one's kernel launched on the simulator
in turn, so the simulated clock advances op by op. Every op leaves an ``OpRecord``; open
profilers (``kbtorch.profile()``) collect them.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class OpRecord:
    """One op on the ahbm device: what ran, when (simulated ns) and what it cost."""

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

    @property
    def tflops(self) -> float:
        return self.flops / self.latency_ns / 1000 if self.latency_ns else 0.0

    @property
    def gbps(self) -> float:
        return self.bytes / self.latency_ns if self.latency_ns else 0.0


@dataclass
class Stream:
    """The device's one in-order stream: its clock (ns) and the profilers listening."""

    clock_ns: float = 0.0
    listeners: list = field(default_factory=list)

    def record(self, name: str, shapes: tuple, kernel: str, latency_ns: float, **kw) -> OpRecord:
        rec = OpRecord(name, shapes, kernel, self.clock_ns, latency_ns, **kw)
        self.clock_ns += latency_ns
        for listener in self.listeners:
            listener.append(rec)
        return rec


STREAM = Stream()
