"""A PE: control processor, scheduler, in-order engine queues and semaphores.

The control processor (CP) runs ahead of the data path: after its switching overhead at
launch it issues the PE's commands back to back, each costing ``d_cmd`` (issue cost model);
the scheduler hands each command to its engine's queue after its own overhead. Each engine
(DMA read, DMA write, GEMM, MATH, IPCQ) is a serial worker executing its queue in order: the
head command starts once its engine is free and its wait-semaphores are satisfied. DMA and
IPCQ engines are free again when their last flit has left the engine's first link; GEMM and
MATH engines when their service ends. A command's signals are applied when it completes.
"""
from __future__ import annotations

from collections import deque
from math import ceil

from ..commands import Composite, Compute, Dma, Fetch, Multicast, Send, Store
from ..network import arrive
from ..registry import Registry
from .composite import CompositeRun


#: Busy spans kept per engine of the timeline PE (a bound on a run's timeline size).
SPANS_MAX = 2000

#: How an engine executes each command type: ``handler(pe, q, p, now, chain)`` starts
#: ``p.cmd`` on engine queue ``q`` of PE model ``pe`` at ``now``.
EXECUTE = Registry("PE execute")


class Pending:
    """A command in an engine queue, with its correlation ID and enqueue time/chain."""

    __slots__ = ("cmd", "corr", "index", "t", "chain")

    def __init__(self, cmd, corr, index, t, chain):
        self.cmd, self.corr, self.index, self.t, self.chain = cmd, corr, index, t, chain


class EngineQueue:
    """One engine of one PE: an in-order queue and a serial worker.

    NOTE: commands the CP has issued wait in ``incoming`` with their arrival times and join
    ``queue`` when the engine looks at it (``pull``); an event marks an arrival only when
    something waits for it (an idle engine, or a composite ready to hand over), so a busy
    engine's arrivals cost no events. Start times and attribution are as if each command
    arrived by its own event.
    """

    def __init__(self, pe: "PEModel", role: str):
        self.pe, self.role, self.node = pe, role, pe.info.node(role)
        self.queue: deque = deque()
        self.incoming: deque = deque()
        self.wake_t = -1
        self.busy = False
        self.free_t, self.free_chain = 0, None
        self.started = 0
        self.current = None
        self.busy_ps = 0
        self.done = 0
        self.spans: list | None = [] if pe.sim.timeline_pe == pe.info.id else None

    def pull(self) -> None:
        """Move the commands that have arrived by now into the queue."""
        inc, now = self.incoming, self.pe.sim.engine.now
        while inc and inc[0].t <= now:
            self.queue.append(inc.popleft())

    def expect(self) -> None:
        """Wake this queue when its next command arrives (something is waiting for it)."""
        if self.incoming and self.wake_t < self.incoming[0].t:
            self.wake_t = self.incoming[0].t
            self.pe.sim.engine.at(self.wake_t, self.wake)

    def wake(self) -> None:
        self.pull()
        run = self.pe.composites.get(self.role)
        if self.busy and run is not None:
            run.hand_over()
        self.try_start()

    def try_start(self) -> None:
        if self.busy:
            return
        if self.incoming:
            self.pull()
        if not self.queue:
            self.expect()
            return
        p = self.queue[0]
        sems = self.pe.sems
        for w in p.cmd.waits:
            if sems.get(w.sem, 0) < w.threshold:
                self.pe.wait_on(w.sem, self)
                return
        self.queue.popleft()
        best_t, chain = p.t, p.chain
        if self.free_t > best_t:
            best_t, chain = self.free_t, self.free_chain
        for w in p.cmd.waits:
            sems[w.sem] -= w.take
            st, sc = self.pe.sem_chain.get(w.sem, (0, None))
            if st > best_t:
                best_t, chain = st, sc
        now = self.pe.sim.engine.now
        if now > best_t:
            chain = (self.node, "queue", now - best_t, chain)
        self.busy, self.started, self.current = True, now, p
        self.pe.sim.engine.record(p.corr, self.node, "start", now, now, p.cmd.describe())
        self.pe.execute(self, p, now, chain)

    def release(self, t: int, chain) -> None:
        """The engine is free again at ``t`` (called at time ``t``)."""
        self.busy_ps += t - self.started
        if self.spans is not None and len(self.spans) < SPANS_MAX:
            self.spans.append((self.started, t, self.current.cmd.describe()))
        self.busy, self.free_t, self.free_chain = False, t, chain
        self.try_start()


class PEModel:
    """Run-time state of one PE: semaphores and engine queues."""

    def __init__(self, sim, info):
        self.sim, self.info = sim, info
        self.sems: dict[str, int] = {}
        self.sem_chain: dict[str, tuple] = {}
        self.waiters: dict[str, list] = {}
        self.engines: dict[str, EngineQueue] = {}
        self.composites: dict = {}

    def release(self) -> None:
        """Drop the run's state (``Simulator.release``): its engine queues point back here."""
        self.engines.clear()
        self.sem_chain.clear()
        self.waiters.clear()
        self.composites.clear()
        self.sim = None

    def queue(self, role: str) -> EngineQueue:
        q = self.engines.get(role)
        if q is None:
            if role not in ("dma_rd", "dma_wr", "gemm", "math", "ipcq"):
                raise ValueError(f"PE {self.info.id}: no engine '{role}'")
            q = self.engines[role] = EngineQueue(self, role)
        return q

    def launch(self, cmds: list, t0: int, chain) -> None:
        """Issue ``cmds`` from the CP starting at ``t0``: one enqueue event per command."""
        g, issue, eng = self.sim.machine.graph, self.sim.machine.issue, self.sim.engine
        cp, sched = self.info.node("cp"), self.info.node("sched")
        cp_ps, sched_ps = g.nodes[cp]["overhead_ps"], g.nodes[sched]["overhead_ps"]
        t = t0 + cp_ps
        chain = (cp, "fixed", cp_ps, chain) if cp_ps else chain
        for i, cmd in enumerate(cmds):
            q = self.queue(cmd.engine)
            desc = cmd.descriptor(issue)
            if desc > issue.composite_cap_bytes:
                raise ValueError(f"PE {self.info.id} command #{i} '{cmd.describe()}': descriptor of "
                                 f"{desc} bytes exceeds the {issue.composite_cap_bytes}-byte cap")
            d = issue.cmd_ps(desc)
            t += d
            chain = (cp, "issue", d, chain)
            corr = eng.new_corr()
            enq_chain = (sched, "fixed", sched_ps, chain) if sched_ps else chain
            eng.record(corr, cp, "issue", t - d, t, f"#{i} {cmd.describe()}")
            q.incoming.append(Pending(cmd, corr, i, t + sched_ps, enq_chain))
        for role in sorted(self.engines):
            self.engines[role].expect()

    def wait_on(self, sem: str, q: EngineQueue) -> None:
        lst = self.waiters.setdefault(sem, [])
        if q not in lst:
            lst.append(q)

    def signal(self, sem: str, inc: int, t: int, chain) -> None:
        self.sems[sem] = self.sems.get(sem, 0) + inc
        self.sem_chain[sem] = (t, chain)
        for q in self.waiters.pop(sem, []):
            q.try_start()

    def execute(self, q: EngineQueue, p: Pending, now: int, chain) -> None:
        EXECUTE[type(p.cmd)](self, q, p, now, chain)

    @EXECUTE.register(Dma)
    def _dma(self, q: EngineQueue, p: Pending, now: int, chain) -> None:
        self.sim.dma.start(self, q, p, now, chain)

    @EXECUTE.register(Multicast)
    def _multicast(self, q: EngineQueue, p: Pending, now: int, chain) -> None:
        self.sim.dma.start_multicast(self, q, p, now, chain)

    @EXECUTE.register(Composite)
    def _composite(self, q: EngineQueue, p: Pending, now: int, chain) -> None:
        prev = self.composites.get(q.role)
        self.composites[q.role] = CompositeRun(self, q, p, now, chain, prev if prev and not prev.finished else None)

    def service_ps(self, q: EngineQueue, cmd) -> int:
        """Time (ps) engine ``q`` takes for ``cmd.flops`` at its ``cmd.dtype`` rate."""
        rates = self.sim.machine.graph.nodes[q.node]["params"].get("tflops", {})
        if cmd.dtype not in rates:
            raise ValueError(f"PE {self.info.id} {q.role}: no rate for dtype '{cmd.dtype}' (have {sorted(rates)})")
        return max(1, ceil(cmd.flops / rates[cmd.dtype]))  # flops / (TFLOP/s) = ps

    @EXECUTE.register(Compute)
    def _compute(self, q: EngineQueue, p: Pending, now: int, chain) -> None:
        cmd = p.cmd
        service = self.service_ps(q, cmd)
        end, chain = now + service, (q.node, "service", service, chain)
        self.sim.engine.record(p.corr, q.node, "compute", now, end, cmd.describe())
        self.sim.engine.at(end, self._compute_done, q, p, end, chain)

    def _compute_done(self, q, p, t, chain) -> None:
        q.release(t, chain)
        self.complete(q, p, t, chain)

    @EXECUTE.register(Fetch)
    def _fetch(self, q: EngineQueue, p: Pending, now: int, chain) -> None:
        self._local(q, p, now, chain, (self.info.node("tcm"), q.node))

    @EXECUTE.register(Store)
    def _store(self, q: EngineQueue, p: Pending, now: int, chain) -> None:
        self._local(q, p, now, chain, (q.node, self.info.node("tcm")))

    def _local(self, q: EngineQueue, p: Pending, now: int, chain, path: tuple) -> None:
        """Fetch (TCM -> engine) or Store (engine -> TCM) over the PE's TCM link."""
        net = self.sim.network

        def done(t, c):
            q.release(t, c)
            self.complete(q, p, t, c)

        net.send(net.message(path, net.flits(p.cmd.nbytes), arrive, done, what=p.cmd.describe()), now, chain, whole=True)

    @EXECUTE.register(Send)
    def _send(self, q: EngineQueue, p: Pending, now: int, chain) -> None:
        cmd = p.cmd
        dst_pe = self.sim.pe(cmd.dst_pe)
        net = self.sim.network
        path = self.sim.machine.route(q.node, dst_pe.info.node("ipcq"))

        def done(t, c):
            dst_pe.signal(cmd.sem, cmd.inc, t, c)
            self.complete(q, p, t, c)

        msg = net.message(path, net.flits(cmd.nbytes), arrive, done, q.release, what=f"ipcq to PE {cmd.dst_pe}")
        net.send(msg, now, chain)

    def complete(self, q: EngineQueue, p: Pending, t: int, chain) -> None:
        q.done += 1
        self.sim.engine.record(p.corr, q.node, "complete", t, t, p.cmd.describe())
        for s in p.cmd.signals:
            self.signal(s.sem, s.inc, t, chain)
        for pe, sem in p.cmd.notify:
            self.sim.pe(pe).signal(sem, 1, t, chain)
        self.sim.command_done(t, chain, self.info.id, p.cmd.mark)

    def stuck(self) -> list[str]:
        """Descriptions of the commands that can never start."""
        out = []
        for role, q in self.engines.items():
            if q.busy:
                p = q.current
                out.append(f"PE {self.info.id} {role} command #{p.index} '{p.cmd.describe()}' (corr {p.corr}): "
                           f"started at {q.started / 1000:.3f} ns and never completed")
            for p in (*q.queue, *q.incoming):
                need = ", ".join(f"'{w.sem}' >= {w.threshold} (is {self.sems.get(w.sem, 0)})" for w in p.cmd.waits)
                why = f"waits on {need}" if need and p is q.queue[0] and not q.busy else "queued behind it"
                out.append(f"PE {self.info.id} {role} command #{p.index} '{p.cmd.describe()}' (corr {p.corr}): {why}")
        return out
