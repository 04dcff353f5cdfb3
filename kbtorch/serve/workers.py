"""Shapes of a step model simulated side by side: this process and ``workers - 1`` others.

A ``SimulatedStep(workers=N)`` simulates the shapes a batch first needs (the corners of a table
cell, the decodes beside a chunk, the held-out shapes of ``error()``) at once, spread over N
processes: this one and N - 1 spawned ones, each holding its own copy of the step model
(``SimulatedStep(workers=1)`` built from the same model, machine and plan).

Which process simulates a shape changes nothing but the wall: a shape's time depends only on
the machine, the model, the plan, the fidelity and the shape (every cache below the step model
is a memo of a pure function), and each worker checks at start that its step model's key (the
machine's digest, the model's config, the plan) is its parent's. The tests compare the two ways
shape by shape.

NOTE: a shape goes to the process that first simulated its rows x new tokens (its GEMMs' M):
the GEMMs' memo is per process, and a decode of 8 rows at 1024 positions costs 0.7 s after one at
512 positions, 3.6 s alone. A batch's new M values are dealt out to the processes with the
fewest of its shapes.

NOTE: spawned, not forked: a forked child of a process whose torch has started its OpenMP
threads can hang. A script that makes workers must guard its main code
(``if __name__ == "__main__":``), as any spawning Python program must.
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

_STEP: list = [None]


def _start(make, args: tuple, key: tuple) -> None:
    step = make(*args, held_out=())
    if step._key != key:
        raise RuntimeError(f"step model worker: its model differs from its parent's ({step._key} != {key})")
    _STEP[0] = step


def _ready() -> bool:
    return True


def _simulate(fidelity: str, shape: tuple) -> float:
    import kbtorch
    with kbtorch.use_fidelity(fidelity):
        return _STEP[0].simulate_ns(shape)


class Workers:
    """``n - 1`` spawned processes beside this one, each with the step model ``make(*args)``
    (model, machine, tp, dp) whose key is ``key``; started at once (they load while this one works)."""

    def __init__(self, n: int, make, args: tuple, key: tuple):
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"workers={n!r}: a positive int (processes that simulate shapes, this one included)")
        context = multiprocessing.get_context("spawn")
        self.pools = [ProcessPoolExecutor(1, mp_context=context, initializer=_start,
                                          initargs=(make, args, key))
                      for _ in range(n - 1)]
        for pool in self.pools:
            pool.submit(_ready)
        self._home: dict = {}           # rows x new tokens -> the process (0: this one) that simulates it

    def _where(self, shapes: list) -> list:
        """The process of each shape: its M's home, or (a new M, largest first) the process with
        the fewest of this batch's shapes so far, then the fewest homes."""
        load, homes = [0] * (1 + len(self.pools)), [0] * (1 + len(self.pools))
        for p in self._home.values():
            homes[p] += 1
        for s in shapes:
            if s[0] * s[1] in self._home:
                load[self._home[s[0] * s[1]]] += 1
        for s in sorted(shapes, key=lambda s: -s[0] * s[1]):
            if s[0] * s[1] not in self._home:
                p = min(range(len(load)), key=lambda i: (load[i], homes[i], i))
                self._home[s[0] * s[1]] = p
                load[p], homes[p] = load[p] + 1, homes[p] + 1
        return [self._home[s[0] * s[1]] for s in shapes]

    def simulate(self, shapes: list, here, fidelity: str) -> list:
        """The ns of each of ``shapes``, in order: ``here(shape)`` for this process's share,
        the workers' simulated meanwhile."""
        where = self._where(shapes)
        futures = {i: self.pools[p - 1].submit(_simulate, fidelity, s)
                   for i, (s, p) in enumerate(zip(shapes, where)) if p}
        mine = {i: here(s) for i, (s, p) in enumerate(zip(shapes, where)) if not p}
        return [mine[i] if i in mine else futures[i].result() for i in range(len(shapes))]

    def close(self) -> None:
        for pool in self.pools:
            pool.shutdown(wait=True, cancel_futures=True)
        self.pools = []
