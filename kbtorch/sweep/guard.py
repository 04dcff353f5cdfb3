"""Per-point limits of a sweep: wall time and memory, so that one point that hangs or grows
without bound fails alone (its row names the limit) and the sweep goes on.

``guard(seconds, nbytes)`` wraps one point's run. Time: in the main thread a SIGALRM timer
(it also interrupts a sleep or a blocking wait); in another thread (a Dask worker's) a
watchdog raises the timeout asynchronously in the point's thread (at its next Python
bytecode). Memory: the process' address space may grow by at most ``nbytes`` while the
point runs (``RLIMIT_AS``, restored after it), so an allocation past it fails with
MemoryError instead of swapping the machine. The defaults are ``limits.LIMITS``
(``KBTORCH_MAX_POINT_S``, ``KBTORCH_MAX_POINT_BYTES``).
"""
from __future__ import annotations

import ctypes
import os
import signal
import threading
from contextlib import contextmanager

__all__ = ["PointTimeout", "guard"]


class PointTimeout(BaseException):
    """A point ran past its time limit. NOTE: a BaseException, so that a workload's own
    ``except Exception`` cannot swallow it."""

    def __str__(self) -> str:
        return "the point ran longer than its time limit (KBTORCH_MAX_POINT_S or --point-timeout)"


def _address_space() -> int | None:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


@contextmanager
def _memory(nbytes: int | None):
    import resource
    used = _address_space() if nbytes else None
    if used is None:
        yield
        return
    old = resource.getrlimit(resource.RLIMIT_AS)
    want = used + nbytes
    if old[1] != resource.RLIM_INFINITY:
        want = min(want, old[1])
    resource.setrlimit(resource.RLIMIT_AS, (want, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, old)


@contextmanager
def _timer(seconds: float | None):
    if not seconds:
        yield
        return
    if threading.current_thread() is threading.main_thread():
        def alarm(signum, frame):
            raise PointTimeout()
        old = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        return
    ident, done, lock, fired = threading.get_ident(), threading.Event(), threading.Lock(), []

    def watch():
        if not done.wait(seconds):
            with lock:
                if not done.is_set():
                    fired.append(True)
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(PointTimeout))
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        with lock:
            done.set()
            if fired:       # NOTE: not raised yet (the block had just ended): clear it
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)
        watcher.join()


@contextmanager
def guard(seconds: float | None, nbytes: int | None):
    """Run the block under a time limit of ``seconds`` and ``nbytes`` of new address space
    (None or 0: no limit)."""
    with _memory(nbytes), _timer(seconds):
        yield
