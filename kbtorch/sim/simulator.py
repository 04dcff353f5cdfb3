"""One simulation run: the engine, the network, memories and PEs of a compiled machine.

``mode="flit"`` moves every flit as its own event (the reference); ``mode="fast"`` (default)
moves trains of up to 128 flits; ``mode="coarse"`` trains of up to 4096 flits, for runs too
large for the fast mode (see ``network.MODES``). A run's latency is the time of its last
completion, and its attribution is the chain of that completion (see ``blame``).
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from . import blame
from .components.dma import DmaModel
from .components.gang import Gangs
from .components.memory import Memory
from .components.pe import PEModel
from .engine import Engine
from ..topology.launch import CAUSE as LAUNCH
from .network import MODES, Network, TrainPolicy, arrive



class SimulationStuck(RuntimeError):
    """The run ended with commands that can never start; ``commands`` describes them."""

    def __init__(self, commands: list[str], t_ps: int):
        self.commands = commands
        lines = "\n  ".join(commands[:20]) + (f"\n  ... and {len(commands) - 20} more" if len(commands) > 20 else "")
        super().__init__(f"simulation stuck at {t_ps / 1000:.3f} ns: {len(commands)} command(s) can never run:\n  {lines}")


@dataclass
class RunResult:
    """What a run returns: latency (ps), its attribution, counters, stats and the trace."""

    latency_ps: int
    chain: tuple | None
    events: int
    wall_s: float
    stats: dict
    graph: object = field(repr=False)
    trace: list[str] | None = field(default=None, repr=False)
    finishes: list[int] | None = field(default=None, repr=False)
    pe_finish_ps: dict = field(default_factory=dict, repr=False)
    timeline: dict = field(default_factory=dict, repr=False)
    programs: dict | None = field(default=None, repr=False)     # {pe: [commands]} as built (kernel.run_programs)
    obtained: object = field(default=None, repr=False)          # how: kernel.steady.Obtained (kernel.run_programs)
    marks: dict = field(default_factory=dict, repr=False)       # {mark: (ps, chain)}: commands' ``mark``
    mark_stats: dict = field(default_factory=dict, repr=False)  # {mark: stats when its last command completed}

    @property
    def latency_ns(self) -> float:
        return self.latency_ps / 1000

    def kind_of(self, element, cause: str) -> str:
        if cause in ("issue", LAUNCH):
            return cause
        if isinstance(element, tuple):
            return self.graph.edges[element]["kind"]
        return self.graph.nodes[element]["kind"]

    def breakdown(self) -> dict[str, int]:
        """Picoseconds of the latency per component kind; they add up to ``latency_ps``."""
        out: dict[str, int] = {}
        for element, cause, ps in blame.segments(self.chain):
            k = self.kind_of(element, cause)
            out[k] = out.get(k, 0) + ps
        return out

    def critical_path(self) -> list[tuple[str, str, int]]:
        """``(element, cause, ps)`` along the critical path, elements as text."""
        return [(e if isinstance(e, str) else "->".join(e), c, ps) for e, c, ps in blame.segments(self.chain)]


class Simulator:
    """A single run on ``machine``; create a new one for each run."""

    def __init__(self, machine, mode: str = "fast", chunk_flits: int | None = None, trace: bool = False,
                 weight=None):
        """``weight(node)``: how many identical units a node stands for in a symmetry-reduced
        run (``symmetry.reduce``); link, memory and engine counters are scaled by it."""
        if mode not in MODES:
            raise ValueError(f"unknown mode '{mode}' (expected one of {sorted(MODES)})")
        self.machine, self.mode = machine, mode
        self.engine = Engine(trace=trace)
        policy = MODES[mode] if chunk_flits is None else TrainPolicy(chunk_flits)
        self.network = Network(self.engine, machine, policy)
        self.dma = DmaModel(self)
        self.gangs = Gangs(self)
        self._pes: dict[int, PEModel] = {}
        self._mems: dict[str, Memory | None] = {}
        self.last_t, self.last_chain = 0, None
        self.marks: dict = {}       # mark -> (t, chain) of the last completion of its commands
        self.mark_stats: dict = {}  # mark -> counters when its last command completed (``run``'s snapshots)
        self._left: dict = {}       # mark -> its commands not completed yet (``run``'s snapshots)
        self.pe_finish: dict[int, int] = {}
        self._used = False
        self.weight = weight or (lambda node: 1)
        self.timeline_pe: int | None = None

    def pe(self, i: int) -> PEModel:
        if not 0 <= i < len(self.machine.pes):
            raise ValueError(f"PE {i} is outside topology '{self.machine.name}' (PEs 0..{len(self.machine.pes) - 1})")
        model = self._pes.get(i)
        if model is None:
            model = self._pes[i] = PEModel(self, self.machine.pes[i])
        return model

    def memory(self, node: str) -> Memory | None:
        """The channel model of an HBM/SRAM node; None for a TCM (written at link rate)."""
        if node not in self._mems:
            d = self.machine.graph.nodes[node]
            self._mems[node] = Memory(node, d["params"], self.machine.flit_bytes) if d["kind"] in ("hbm", "sram") else None
        return self._mems[node]

    def command_done(self, t: int, chain, pe: int | None = None, mark: int = -1) -> None:
        if t >= self.last_t:
            self.last_t, self.last_chain = t, chain
        if pe is not None and t > self.pe_finish.get(pe, -1):
            self.pe_finish[pe] = t
        if mark >= 0:
            if t >= self.marks.get(mark, (-1,))[0]:
                self.marks[mark] = (t, chain)
            if mark in self._left:
                self._left[mark] -= 1
                if not self._left[mark]:
                    self.mark_stats[mark] = self._stats()

    def _start(self) -> float:
        if self._used:
            raise RuntimeError("a Simulator runs once; create a new one")
        self._used = True
        return time.perf_counter()

    def run(self, programs: dict, snapshots: frozenset = frozenset()) -> RunResult:
        """Launch ``{pe: [commands]}`` at t=0 and run to completion; each PE's program starts
        when the machine's kernel launch reaches it (``Machine.launch_segments``).
        ``snapshots``: marks whose counters are kept (``RunResult.mark_stats``) as they stand
        when the last command of that mark completes."""
        t0 = self._start()
        self._left = Counter(c.mark for cmds in programs.values() for c in cmds if c.mark in snapshots) \
            if snapshots else {}
        self.timeline_pe = min(programs) if programs else None
        for pe in sorted(programs):
            model, t, chain = self.pe(pe), 0, None
            for element, ps in self.machine.launch_segments(pe):
                t, chain = t + ps, (element, LAUNCH, ps, chain)
            model.launch(list(programs[pe]), t, chain)
        self.engine.run()
        stuck = [line for i in sorted(self._pes) for line in self._pes[i].stuck()] + self.gangs.stuck()
        if stuck:
            raise SimulationStuck(stuck, self.engine.now)
        return self._result(t0)

    def release(self) -> None:
        """Free the run's state once its result is taken: its components point back at the
        simulator, so without this it waits for the cyclic garbage collector.

        NOTE: graph mode keeps millions of commands alive, and each full collection scans
        them all; dead simulators left to the collector are what triggered those
        collections. Released, a run's links, calendars and PE models go at once."""
        self.network.release()
        for model in self._pes.values():
            model.release()
        self._pes.clear()
        self._mems.clear()
        self.dma = self.gangs = None

    def run_messages(self, messages: list) -> RunResult:
        """Inject ``[(src_node, dst_node, nbytes)]`` at t=0 as raw network messages; the
        result's ``finishes`` holds each message's last-flit arrival (ps)."""
        t0 = self._start()
        finishes = [0] * len(messages)
        net = self.network
        for i, (src, dst, nbytes) in enumerate(messages):
            def done(t, chain, i=i):
                finishes[i] = t
                self.command_done(t, chain)
            paths = self.machine.paths(src, dst)
            msg = net.message(paths[0][0], net.flits(nbytes), arrive, done, what=f"message {i}", spray=paths)
            net.send(msg, 0, None)
        self.engine.run()
        result = self._result(t0)
        result.finishes = finishes
        return result

    def _result(self, t0: float) -> RunResult:
        wall = time.perf_counter() - t0
        if blame.total(self.last_chain) != self.last_t:
            raise AssertionError(f"attribution {blame.total(self.last_chain)} ps != latency {self.last_t} ps")
        trace = self.engine.trace_lines() if self.engine.trace is not None else None
        return RunResult(self.last_t, self.last_chain, self.engine.events, wall, self._stats(), self.machine.graph, trace,
                         pe_finish_ps=dict(sorted(self.pe_finish.items())), timeline=self._timeline(),
                         marks=dict(sorted(self.marks.items())), mark_stats=dict(sorted(self.mark_stats.items())))

    def _timeline(self) -> dict:
        """``{"pe": id, role: ((start_ps, end_ps, command), ...)}``: the busy spans of each
        engine of the run's first PE (at most ``SPANS_MAX`` per engine)."""
        model = self._pes.get(self.timeline_pe)
        if model is None:
            return {}
        out = {role: tuple(q.spans) for role, q in sorted(model.engines.items()) if q.spans}
        return dict(out, pe=self.timeline_pe) if out else {}

    def _stats(self) -> dict:
        links = {}
        for link in self.network.links():
            s = links.setdefault(link.kind, {"links": 0, "flits": 0, "busy_ps": 0, "max_busy_ps": 0})
            w = self.weight(link.key[0])
            s["links"] += w
            s["flits"] += w * link.flits
            s["busy_ps"] += w * link.flits * link.flit_ps
            s["max_busy_ps"] = max(s["max_busy_ps"], link.flits * link.flit_ps)
        mems = {n: {"bursts": m.bursts, "busy_ps": m.busy_ps} for n, m in self._mems.items() if m is not None}
        engines = {}
        for i in sorted(self._pes):
            w = self.weight(self.machine.pes[i].prefix)
            for role, q in self._pes[i].engines.items():
                e = engines.setdefault(role, {"commands": 0, "busy_ps": 0})
                e["commands"] += w * q.done
                e["busy_ps"] += w * q.busy_ps
        return {"links": links, "memories": mems, "engines": engines}
