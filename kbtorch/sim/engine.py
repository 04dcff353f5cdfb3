"""The event engine: a simpy Environment in integer picoseconds.

Every scheduled action is one simpy event whose single callback runs a model function.
Ties are deterministic: events at the same time fire by (priority, insertion order), with
``NODE`` events (switching overheads, service completions, command hand-offs) before
``EDGE`` events (flit trains reaching a link). The model never iterates hash-ordered sets, so a
run yields the same trace under any PYTHONHASHSEED.

Correlation IDs are stamped on every request at injection (``new_corr``) and every trace
record carries one, so a request's trace can be recovered from injection to completion.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from heapq import heappop, heappush

import simpy
from simpy.events import Event

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


class _Call(Event):
    """A pre-triggered simpy event that calls ``fn(*args)`` when the engine reaches it."""

    def __init__(self, env, fn, args):
        self.env, self.fn, self.args = env, fn, args
        self.callbacks = _CALL
        self._ok, self._value = True, None


def _fire(ev):
    ev.fn(*ev.args)


_CALL = [_fire]


class Engine:
    """Integer-ps discrete-event engine with correlation IDs and an optional trace."""

    def __init__(self, trace: bool = False):
        self.env = simpy.Environment(initial_time=0)
        self.trace: list | None = [] if trace else None
        self.events = 0
        self._corr = 0
        self._queue, self._eid = self.env._queue, self.env._eid

    @property
    def now(self) -> int:
        return self.env.now

    def new_corr(self) -> int:
        self._corr += 1
        return self._corr

    def at(self, time_ps: int, fn, *args, priority: int = NODE) -> None:
        """Run ``fn(*args)`` at absolute time ``time_ps`` (not before now)."""
        if time_ps < self.env._now:
            raise RuntimeError(f"event scheduled in the past ({time_ps} < {self.env._now} ps)")
        heappush(self._queue, (time_ps, priority, next(self._eid), _Call(self.env, fn, args)))

    def schedule(self, time_ps: int, event: Event, priority: int) -> None:
        """Schedule a pre-triggered simpy ``event`` (callbacks set) at absolute ``time_ps``."""
        heappush(self._queue, (time_ps, priority, next(self._eid), event))

    def record(self, corr: int, element, what: str, start_ps: int, end_ps: int, detail="") -> None:
        """Append one trace record (only when tracing is on)."""
        if self.trace is not None:
            self.trace.append((start_ps, end_ps, corr, _label(element), what, detail))

    def run(self) -> None:
        """Fire events in (time, priority, insertion) order until none is left.

        NOTE: this is simpy's ``Environment.step`` loop without its per-event exception
        bookkeeping (our events never fail); the queue, clock and event ids are simpy's.
        The cyclic garbage collector is paused meanwhile (``paused_gc``).
        """
        env, queue = self.env, self._queue
        n = 0
        with paused_gc():
            try:
                while queue:
                    env._now, _, _, ev = heappop(queue)
                    callbacks, ev.callbacks = ev.callbacks, None
                    for cb in callbacks:
                        cb(ev)
                    n += 1
            finally:
                self.events += n

    def trace_lines(self) -> list[str]:
        """The trace as text lines, one per record, in the order the records were made."""
        return [f"{s}\t{e}\t{c}\t{el}\t{w}\t{d}" for s, e, c, el, w, d in (self.trace or [])]


def _label(element) -> str:
    return element if isinstance(element, str) else "->".join(element)
