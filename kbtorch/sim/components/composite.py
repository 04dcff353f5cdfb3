"""Composite commands: the PE scheduler tiles and streams DMA_READ -> FETCH -> GEMM/MATH ->
STORE -> DMA_WRITE with overlapping stages.

Each stage is a serial unit that takes the tiles in order. Stage ``s`` of tile ``i`` starts
when stage ``s-1`` of tile ``i`` is done (its input is there), the unit has let go of tile
``i-1`` (a compute, fetch or store unit when that tile is done; a DMA unit once its
requests or data have left, so reads of later tiles overlap the flight of earlier ones),
and stage ``s+1`` of tile ``i-B`` is done (with ``B``-deep buffering, the buffer that tile
``i`` fills has been drained). Reads and writes are real DMA
transfers through the graph (initiated by the PE's DMA read and write engines), fetch and
store move bytes over the TCM <-> engine links, and the compute stage holds the engine for
``flops / rate``. The command occupies its engine's queue from its first stage to its last.
"""
from __future__ import annotations

from typing import NamedTuple

from ..commands import Loc
from ..network import arrive
from .dma import Countdown as _Countdown


class _Xfer(NamedTuple):
    src: Loc
    dst: Loc
    nbytes: int
    src_stride: int = 0
    dst_stride: int = 0


class CompositeRun:
    """The execution of one ``Composite`` command on PE model ``pe``, engine queue ``q``."""

    def __init__(self, pe, q, p, now: int, chain, prev=None):
        self.pe, self.q, self.p, self.cmd = pe, q, p, p.cmd
        self.prev, self.follower, self.released, self.finished = prev, None, False, False
        self.handoff = None
        if prev is not None:
            prev.follower = self
        self.sim, cmd = pe.sim, p.cmd
        present = (("read", cmd.reads), ("fetch", cmd.fetch_bytes), ("compute", cmd.flops),
                   ("store", cmd.store_bytes), ("write", cmd.writes))
        self.stages = [name for name, work in present if work]
        if not self.stages:
            raise ValueError(f"PE {pe.info.id} {cmd.describe()}: a composite needs at least one stage")
        self.done = [[None] * cmd.tiles for _ in self.stages]
        self.freed = [[None] * cmd.tiles for _ in self.stages]
        self.next = [0] * len(self.stages)
        self.busy = [False] * len(self.stages)
        self.start = (now, chain)
        self.read_slot = sum(m.nbytes for m in cmd.reads)
        self.write_slot = sum(m.nbytes for m in cmd.writes)
        self.tcm = pe.info.node("tcm")
        self.advance()

    def _ready(self, s: int, i: int):
        """(time, chain) at which stage ``s`` may take tile ``i``, or None if not yet."""
        best = self.start
        buffers = self.cmd.buffers
        for need in (self.done[s - 1][i] if s > 0 else best,
                     self.freed[s][i - 1] if i > 0 else best,
                     self.done[s + 1][i - buffers] if s + 1 < len(self.stages) and i >= buffers else best):
            if need is None:
                return None
            if need[0] > best[0]:
                best = need
        if self.prev is not None and i < buffers:
            for need in self.prev.handover(self.stages[s], i, buffers):
                if need is None:
                    return None
                if need[0] > best[0]:
                    best = need
        return best

    def hand_over(self) -> None:
        """Let the engine queue start the next command early if it is a composite and this
        run's first stage has taken all its tiles (called then, and when a command arrives)."""
        if self.released or self.handoff is None:
            return
        if not self.q.queue:
            self.q.pull()
            if not self.q.queue:
                self.q.expect()
                return
        if isinstance(self.q.queue[0].cmd, type(self.cmd)):
            self.released = True
            self.q.release(*self.handoff)

    def handover(self, name: str, i: int, buffers: int) -> list:
        """What the next composite's stage ``name`` needs from this one before taking its
        tile ``i``: this run's same unit done with its last tile, and the buffer that tile
        ``i`` will fill drained (the two runs share units and buffers)."""
        if name not in self.stages:
            return []
        s, last = self.stages.index(name), self.cmd.tiles - 1
        needs = [self.freed[s][last]] if i == 0 else []
        j = self.cmd.tiles - buffers + i
        if s + 1 < len(self.stages) and j >= 0:
            needs.append(self.done[s + 1][j])
        return needs

    def advance(self) -> None:
        for s in range(len(self.stages)):
            while not self.busy[s] and self.next[s] < self.cmd.tiles:
                ready = self._ready(s, self.next[s])
                if ready is None:
                    break
                i = self.next[s]
                self.next[s] += 1
                self.busy[s] = True
                now = self.sim.engine.now
                t, chain = ready
                if now > t:
                    chain = (self.q.node, "queue", now - t, chain)
                getattr(self, "_" + self.stages[s])(s, i, now, chain)

    def _free(self, s: int, i: int, t: int, chain) -> None:
        """Stage ``s``'s unit can take the next tile (a DMA stage: its requests are out)."""
        self.busy[s] = False
        self.freed[s][i] = (t, chain)
        self._progress(s, i, t, chain)

    def _progress(self, s: int, i: int, t: int, chain) -> None:
        """Advance this run and the composite queued behind it; once the first stage has
        taken every tile, let the engine queue start the next command if it is a composite
        (composites on one engine stream back to back through shared stage units)."""
        self.advance()
        if s == 0 and i == self.cmd.tiles - 1:
            self.handoff = (t, chain)
            self.hand_over()
        if self.follower is not None:
            self.follower.advance()

    def _finish(self, s: int, i: int, t: int, chain) -> None:
        if self.freed[s][i] is None:
            self.busy[s] = False
            self.freed[s][i] = (t, chain)
        self.done[s][i] = (t, chain)
        self.sim.engine.record(self.p.corr, self.q.node, self.stages[s], t, t, f"tile {i}")
        if s == len(self.stages) - 1 and i == self.cmd.tiles - 1:
            self.finished = True
            if self.follower is not None:
                self.follower.prev = None
            if not self.released:
                self.released = True
                self.q.release(t, chain)
            self.pe.complete(self.q, self.p, t, chain)
            if self.follower is not None:
                self.follower.advance()
            return
        self._progress(s, i, t, chain)

    def _later(self, s: int, i: int, t: int, chain) -> None:
        self.sim.engine.at(t, self._finish, s, i, t, chain)

    def _moves(self, s: int, i: int, now: int, chain, xfers: list, engine: str) -> None:
        """Start ``xfers`` together; the unit is free when all are sent, the tile done when all
        have landed (reads of later tiles overlap the flight of earlier ones)."""
        done = _Countdown(len(xfers), now, chain, lambda t, c: self._finish(s, i, t, c))
        sent = _Countdown(len(xfers), now, chain, lambda t, c: self._free(s, i, t, c))
        self._start_moves(i, now, chain, xfers, engine, done, sent)

    def _start_moves(self, i: int, now: int, chain, xfers: list, engine: str, done, sent) -> None:
        for x in xfers:
            self.sim.dma.transfer(self.pe.info.node(engine), self.tcm, x, now, chain, done.tick, sent.tick,
                                  f"{self.cmd.describe()} tile {i}")

    def _read(self, s: int, i: int, now: int, chain) -> None:
        base = self.cmd.staging.addr + (i % self.cmd.buffers) * self.read_slot
        xfers, shared, off = [], [], 0
        for m in self.cmd.reads:
            dst = Loc(self.tcm, base + off)
            if m.share is None:
                xfers.append(_Xfer(Loc(m.loc.node, m.loc.addr + i * m.step), dst, m.nbytes, m.stride))
            else:
                shared.append((m, dst))
            off += m.nbytes
        if not shared:
            return self._moves(s, i, now, chain, xfers, "dma_rd")
        done = _Countdown(len(xfers) + len(shared), now, chain, lambda t, c: self._finish(s, i, t, c))
        sent = _Countdown(len(xfers) + len(shared), now, chain, lambda t, c: self._free(s, i, t, c))
        self._start_moves(i, now, chain, xfers, "dma_rd", done, sent)
        for m, dst in shared:
            self.sim.gangs.join(self, m, i, dst, done.tick, sent.tick, now, chain)

    def _write(self, s: int, i: int, now: int, chain) -> None:
        if not self.cmd.stores_after(i):
            return self._later(s, i, now, chain)
        k = i // self.cmd.accumulate
        base = self.cmd.staging.addr + self.cmd.buffers * self.read_slot + (k % self.cmd.buffers) * self.write_slot
        xfers, off = [], 0
        for m in self.cmd.writes:
            xfers.append(_Xfer(Loc(self.tcm, base + off), Loc(m.loc.node, m.loc.addr + k * m.step), m.nbytes, 0, m.stride))
            off += m.nbytes
        self._moves(s, i, now, chain, xfers, "dma_wr")

    def _local(self, s: int, i: int, now: int, chain, path: tuple, nbytes: int) -> None:
        net = self.sim.network
        msg = net.message(path, net.flits(nbytes), arrive, lambda t, c: self._finish(s, i, t, c),
                          what=f"{self.cmd.describe()} {self.stages[s]} tile {i}")
        net.send(msg, now, chain, whole=True)

    def _fetch(self, s: int, i: int, now: int, chain) -> None:
        self._local(s, i, now, chain, (self.tcm, self.q.node), self.cmd.fetch_bytes)

    def _store(self, s: int, i: int, now: int, chain) -> None:
        if not self.cmd.stores_after(i):
            return self._later(s, i, now, chain)
        self._local(s, i, now, chain, (self.q.node, self.tcm), self.cmd.store_bytes)

    def _compute(self, s: int, i: int, now: int, chain) -> None:
        service = self.pe.service_ps(self.q, self.cmd)
        self._later(s, i, now + service, (self.q.node, "service", service, chain))
