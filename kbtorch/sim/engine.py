"""The event engine: a heap of events in integer picoseconds.

``Engine.at(time_ps, fn, *args, priority=...)`` is the one way to schedule anything: PEs,
memories, composites and the network's flit trains all call it, and ``run`` fires
``fn(*args)`` in order. Ties are deterministic: events at the same time fire by (priority,
insertion order), with ``NODE`` events (switching overheads, service completions, command
hand-offs) before ``EDGE`` events (flit trains reaching a link). The model never iterates
hash-ordered sets, so a run yields the same trace under any PYTHONHASHSEED.

Correlation IDs are stamped on every request at injection (``new_corr``) and every trace
record carries one, so a request's trace can be recovered from injection to completion.

NOTE: our own heap of ``(time_ps, priority, seq, fn, args)``, not simpy (issue 13, decided
by measurement, CPU time, best of several runs). simpy through its public API only
(``Environment.schedule``/``run``, one triggered ``Event`` per ``at``) gave the same
results, event for event, but cost about 30% of the flit-exact rate: 0.50-0.53 M events/s
against 0.69-0.73 M for this heap (1 MiB PE0->PE255, flit mode) and 0.40-0.46 M against
0.53-0.62 M on contended flit traffic; keeping each train as its own simpy event (a second
way to schedule) was still about 10% slower. The coarse ``all_reduce(group="sip",
nbytes=1 MiB, algo="ring")`` took 6.3-6.4 s of CPU with simpy against 5.0-5.1 s. For
reference, the engine this replaces (simpy's private queue, train hops pushed onto it
directly) ran 0.75-0.79 M events/s and the all-reduce in 6.1-6.6 s.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from heapq import heappop, heappush
from itertools import count

NODE, EDGE = 0, 1


@contextmanager
def paused_gc():
    """Pause the cyclic garbage collector inside the block. NOTE: simulation runs and kernel
    builds make millions of small acyclic objects (tuples, commands) that the collector
    would scan again and again as they accumulate, for a third of the time spent."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


class Engine:
    """Integer-ps discrete-event engine with correlation IDs and an optional trace.

    ``now``: the time (ps) of the event being fired (read it, never set it); ``events``: how
    many events have fired."""

    __slots__ = ("now", "trace", "events", "_corr", "_queue", "_seq")

    def __init__(self, trace: bool = False):
        self.now = 0
        self.trace: list | None = [] if trace else None
        self.events = 0
        self._corr = 0
        self._queue: list = []
        self._seq = count()

    def new_corr(self) -> int:
        self._corr += 1
        return self._corr

    def at(self, time_ps: int, fn, *args, priority: int = NODE) -> None:
        """Run ``fn(*args)`` at absolute time ``time_ps`` (not before now): the one way to
        schedule anything."""
        if time_ps < self.now:
            raise RuntimeError(f"event scheduled in the past ({time_ps} < {self.now} ps)")
        heappush(self._queue, (time_ps, priority, next(self._seq), fn, args))

    def record(self, corr: int, element, what: str, start_ps: int, end_ps: int, detail="") -> None:
        """Append one trace record (only when tracing is on)."""
        if self.trace is not None:
            self.trace.append((start_ps, end_ps, corr, _label(element), what, detail))

    def run(self) -> None:
        """Fire events in (time, priority, insertion) order until none is left, the cyclic
        garbage collector paused meanwhile (``paused_gc``)."""
        queue = self._queue
        n = 0
        with paused_gc():
            try:
                while queue:
                    self.now, _, _, fn, args = heappop(queue)
                    fn(*args)
                    n += 1
            finally:
                self.events += n

    def trace_lines(self) -> list[str]:
        """The trace as text lines, one per record, in the order the records were made."""
        return [f"{s}\t{e}\t{c}\t{el}\t{w}\t{d}" for s, e, c, el, w, d in (self.trace or [])]


def _label(element) -> str:
    return element if isinstance(element, str) else "->".join(element)
