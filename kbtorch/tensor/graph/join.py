"""Graph mode's scheduler: the kernels of a graph as ONE program per PE, run in ONE simulation.

Every kernel keeps the per-PE command programs its op family built (``RunResult.programs``)
on the PEs its op chose (placement policy ``share``, see docs/model.md "Graph mode"); the
scheduler only joins them, in the graph's order, and chains them by semaphores on the PEs,
in the SDLA style of Maia 200 (no host round trip between kernels):

- each kernel's semaphores and shared-read keys are renamed apart (``"<k>.<name>"``), so
  kernels never share one;
- on every PE, the last command of each engine a kernel uses raises ``"<k>.done"`` (a
  1-byte FETCH on that engine carries it when that command already raises two semaphores);
- a kernel waits, on each PE, for ALL of each kernel it depends on (a barrier: the
  producer's PEs on each chip report up a tree to the chip's first, which tells the
  consumer's PEs there down a relay tree), since what it reads lies wherever the producer
  wrote it; only where it reads on each PE what the producer's same PE wrote, or a whole
  copy (``near``: a collective's result, a replicated pass, a pass over the same split),
  it waits on the same PE through that ``done`` semaphore (level: threshold = its engines
  there, no decrement), and on a PE the producer does not use, through one IPCQ message
  from one of the producer's PEs (a relay);
- the waits go on the first command of each engine the kernel uses on that PE, or, beyond
  the two waits a command takes, on 1-byte FETCH gates just before it on that engine.

The whole graph is one kernel launch (``Simulator.run``): each PE's command processor issues
every command of every kernel, in order, paying command issue for each; engines are in-order
queues, so kernels that share a PE share its engines, and kernels everywhere share links,
routers and HBM channels, all simulated together. Symmetry reduction applies to the joined
programs as to any kernel's.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

from ...kernel import current_fidelity, steady
from ...kernel.door import Composite, Fetch, Send, Signal, Wait, simulator, symmetry
from ...kernel.policy import graph_mode

COMPUTE = ("gemm", "math")


@dataclass(frozen=True)
class Scheduled:
    """A simulated graph: the run, and each kernel's span (ps from the graph's launch):
    ``ready_ps`` when the last kernel it depends on finished (its launch reaching its first
    PE for a kernel without any), ``finish_ps`` when its last PE finished it, ``chains``
    the attribution of that finish (a simulated graph's; ``()`` where none was kept)."""

    result: object
    ready_ps: tuple
    finish_ps: tuple
    commands: int
    chains: tuple = field(default=(), compare=False, repr=False)

    @property
    def latency_ps(self) -> int:
        return self.result.latency_ps


def _rename(cmd, prefix: str):
    kw = {}
    if cmd.waits:
        kw["waits"] = tuple(Wait(prefix + w.sem, w.threshold, w.dec) for w in cmd.waits)
    if cmd.signals:
        kw["signals"] = tuple(Signal(prefix + s.sem, s.inc) for s in cmd.signals)
    if cmd.notify:
        kw["notify"] = tuple((pe, prefix + s) for pe, s in cmd.notify)
    if isinstance(cmd, Send):
        kw["sem"] = prefix + cmd.sem
    if isinstance(cmd, Composite) and any(m.share for m in cmd.reads):
        # NOTE: a gang's shared read is matched by its key: two kernels running at once on
        # different PEs (expert GEMMs on their chips) must not join each other's tiles.
        kw["reads"] = tuple(replace(m, share=replace(m.share, key=prefix + m.share.key)) if m.share else m
                            for m in cmd.reads)
    return replace(cmd, **kw) if kw else cmd


def _gate(engine: str, waits=(), signals=(), label="gate"):
    """A 1-byte FETCH on a compute engine: waits and signals where a command has no room."""
    return Fetch(1, engine=engine, waits=tuple(waits), signals=tuple(signals), label=label)


def _finish_signals(cmds: list, k: int) -> tuple[list, int]:
    """``cmds`` with ``"<k>.done"`` raised by the last command of each engine; -> (commands,
    engines)."""
    last = {}
    for i, c in enumerate(cmds):
        last[c.engine] = i
    out, done = list(cmds), Signal(f"{k}.done")
    extra = []
    for engine, i in last.items():
        c = out[i]
        if len(c.signals) < 2:
            out[i] = replace(c, signals=c.signals + (done,))
        elif engine in COMPUTE:
            extra.append((i, _gate(engine, signals=(done,), label=f"kernel {k} done")))
        else:
            raise NotImplementedError(f"graph scheduler: kernel {k}'s last {engine} command "
                                      f"'{c.describe()}' already raises two semaphores")
    for i, gate in sorted(extra, key=lambda x: -x[0]):
        out.insert(i + 1, gate)
    return out, len(last)


def _gated(cmds: list, waits: list, k: int, math_waits: list = ()) -> list:
    """``cmds`` with ``waits`` before the first command of each engine (and ``math_waits``
    before the first MATH command): on that command, or on gates before it on its engine;
    a DMA or IPCQ command without room for them waits for ``"<k>.go"``, raised by gates on
    the MATH engine that wait for them."""
    if not waits and not math_waits:
        return cmds
    firsts = {}
    for c in cmds:
        firsts.setdefault(c.engine, c)
    out, go = [], [Wait(f"{k}.go", 1, 0)]
    if any(e not in COMPUTE and len(c.waits) + len(waits) > 2 for e, c in firsts.items()):
        out = _gates("math", waits, k, last=(Signal(f"{k}.go"),))
    for c in cmds:
        if firsts.get(c.engine) is c:
            need = waits if c.engine in COMPUTE or len(c.waits) + len(waits) <= 2 else go
            need = list(need) + list(math_waits) if c.engine == "math" else need
            if not need:
                out.append(c)
                continue
            if len(c.waits) + len(need) <= 2:
                c = replace(c, waits=c.waits + tuple(need))
            elif c.engine in COMPUTE:
                out += _gates(c.engine, need, k)
            else:
                raise NotImplementedError(f"graph scheduler: kernel {k}'s first {c.engine} command "
                                          f"'{c.describe()}' waits on two semaphores already")
        out.append(c)
    return out


def _gates(engine: str, waits: list, k: int, last=()) -> list:
    """1-byte FETCH gates on ``engine`` waiting for ``waits``, two each; the last one raises ``last``."""
    n = range(0, len(waits), 2)
    return [_gate(engine, waits[j:j + 2], last if j == n[-1] else (), label=f"kernel {k} gate") for j in n]


def build(kernels: list, deps: list, machine, late: list | None = None, near: list | None = None) -> tuple[dict, int]:
    """The joined programs ``{pe: [commands]}`` of ``kernels`` (each a ``{pe: [commands]}``)
    where kernel ``k`` depends on the kernels ``deps[k]`` (earlier ones), those of
    ``late[k]`` for its MATH engine only (a GEMM epilogue's operands); -> (programs,
    commands). Of a dependency in ``near[k]`` (each PE reads only what the producer's
    same PE wrote, or any one copy of a whole result) a PE waits for the producer's part on
    itself, or hears of one by a relay; of any other, for ALL of the producer's PEs on its
    chip: a barrier (``_Barriers``)."""
    programs: dict = {}
    engines: dict = {}          # (kernel, pe) -> engines raising its done semaphore there
    told: dict = {}             # kernel -> PEs it does not run on that know it is done
    ends: dict = {}             # pe -> {kernel: index in its program just after that kernel}
    pes_of = []

    def put(src: int, d: int, cmd) -> None:
        """A message of kernel ``d`` from ``src``, right after the commands there of ``d`` and
        of the kernels issued before it. NOTE: not behind those of the kernels issued since,
        which may wait on their own inputs: the IPCQ queue is in order."""
        prog, marks = programs.setdefault(src, []), ends.setdefault(src, {})
        at = max((i for x, i in marks.items() if x <= d), default=0)
        prog.insert(at, cmd)
        for x, i in marks.items():
            if i >= at:
                marks[x] = i + 1

    barriers = _Barriers(put, engines, pes_of, machine)
    for k, prog in enumerate(kernels):
        pes = [pe for pe in sorted(prog) if prog[pe]]
        pes_of.append(pes)
        mine = [d for d in sorted(deps[k]) if pes_of[d]]
        local = {d for d in mine if near and d in near[k]}
        for d in mine:          # NOTE: messages first: before this kernel's commands on any PE
            if d not in local:
                barriers.tell(d, pes)
                continue
            new = [q for q in pes if (d, q) not in engines and q not in told.setdefault(d, set())]
            if new:
                _relay_tree(put, d, pes_of[d] + sorted(told[d]), new, engines, machine)
                told[d].update(new)
        for pe in pes:
            waits = {d: ((Wait(f"{d}.done", engines[(d, pe)], 0) if (d, pe) in engines else Wait(f"{d}.relay", 1, 0)),)
                     if d in local else barriers.knows[d][pe] for d in mine}
            lates = [w for d in mine if late and d in late[k] for w in waits[d]]
            early = [w for d in mine if not (late and d in late[k]) for w in waits[d]]
            cmds = [_rename(c, f"{k}.") for c in prog[pe]]
            cmds, engines[(k, pe)] = _finish_signals(cmds, k)
            programs.setdefault(pe, []).extend(_gated(cmds, early, k, lates))
            ends.setdefault(pe, {})[k] = len(programs[pe])
    return programs, sum(len(v) for v in programs.values())


#: PEs each PE tells that a kernel is done, in a relay tree.
FANOUT = 4


class _Barriers:
    """All of a kernel done, as its dependents hear it: on each chip its PEs report up a tree
    (``FANOUT`` children a PE, ``"<d>.up"``) to the chip's first, which then knows its chip
    is done and tells the dependents' PEs there down a relay tree (``"<d>.all"``); a chip
    where it ran on no PE hears from every chip it ran on. ``knows[d][pe]``: the waits after
    which ``pe`` knows it.

    NOTE: what a kernel reads of its producer's result lies anywhere the producer wrote it
    (a GEMM's output tiles over all its PEs, read whole by a pass on every PE): the
    consumer waits for all of it, as a kernel boundary does in eager mode. One barrier
    serves every dependent of a kernel."""

    def __init__(self, put, engines: dict, pes_of: list, machine):
        self.put, self.engines, self.pes_of, self.machine = put, engines, pes_of, machine
        self.knows: dict = {}
        self.roots: dict = {}       # d -> {chip: root PE}
        self.knowing: dict = {}     # d -> {chip: PEs there in knows[d]}

    def tell(self, d: int, pes: list) -> None:
        if d not in self.knows:
            self._gather(d)
        knows, knowing, chip_of = self.knows[d], self.knowing[d], self.machine.chip_of
        new: dict = {}
        for q in pes:
            if q not in knows:
                new.setdefault(chip_of(q), []).append(q)
        for chip, targets in sorted(new.items()):
            if chip not in self.roots[d]:       # NOTE: every chip it ran on tells this one
                first, roots = targets.pop(0), sorted(self.roots[d].values())
                for r in roots:
                    self._send(r, d, first, "all")
                knows[first] = (Wait(f"{d}.all", len(roots), 0),)
                knowing[chip] = {first}
            told = sorted(knowing[chip])
            i = 0
            while targets:
                src = told[i]
                for q in targets[:FANOUT]:
                    self._send(src, d, q, "all")
                    knows[q] = (Wait(f"{d}.all", 1, 0),)
                    told.append(q)
                    knowing[chip].add(q)
                targets, i = targets[FANOUT:], i + 1

    def _gather(self, d: int) -> None:
        chips: dict = {}
        for pe in self.pes_of[d]:
            chips.setdefault(self.machine.chip_of(pe), []).append(pe)
        self.knows[d], self.roots[d], self.knowing[d] = {}, {}, {}
        for chip, pes in chips.items():
            for i, pe in enumerate(pes):
                children = len(pes[FANOUT * i + 1:FANOUT * i + FANOUT + 1])
                waits = (Wait(f"{d}.done", self.engines[(d, pe)], 0),)
                waits += (Wait(f"{d}.up", children, 0),) if children else ()
                if i:
                    self.put(pe, d, Send(dst_pe=pes[(i - 1) // FANOUT], sem=f"{d}.up", waits=waits,
                                         label=f"kernel {d} done here and below: tell PE {pes[(i - 1) // FANOUT]}"))
                else:
                    self.knows[d][pe], self.roots[d][chip], self.knowing[d][chip] = waits, pe, {pe}

    def _send(self, src: int, d: int, dst: int, sem: str) -> None:
        self.put(src, d, Send(dst_pe=dst, sem=f"{d}.{sem}", waits=self.knows[d][src],
                              label=f"kernel {d} done everywhere: tell PE {dst}"))


def _relay_tree(put, d: int, sources: list, targets: list, engines: dict, machine) -> None:
    """Kernel ``d`` done, told to the PEs ``targets`` it does not run on: each of its PEs,
    once done there, sends an IPCQ message to up to ``FANOUT`` of them, and each PE told
    tells ``FANOUT`` more (a tree, breadth first), before its own next commands.

    NOTE: on a system the tree crosses between chips once: a chip without a source first
    hears from one (the sources taking the chips in turn), then its PEs tell each other."""
    def told_wait(pe):
        return Wait(f"{d}.done", engines[(d, pe)], 0) if (d, pe) in engines else Wait(f"{d}.relay", 1, 0)

    def send(src, wait, pe):
        put(src, d, Send(dst_pe=pe, sem=f"{d}.relay", waits=(wait,), label=f"kernel {d} done: relay to PE {pe}"))

    chips: dict = {}
    for pe in targets:
        chips.setdefault(machine.chip_of(pe), []).append(pe)
    held = {machine.chip_of(pe) for pe in sources}
    roots = {}
    for i, (chip, pes) in enumerate(sorted((c, p) for c, p in chips.items() if c not in held)):
        src = sources[i % len(sources)]
        send(src, told_wait(src), pes[0])
        roots[chip] = pes.pop(0)
    for chip, pes in sorted(chips.items()):
        here = [roots[chip]] if chip in roots else [pe for pe in sources if machine.chip_of(pe) == chip]
        told = [(pe, told_wait(pe)) for pe in here]
        queue, i = list(pes), 0
        while i < len(told) and queue:
            src, wait = told[i]
            for pe in queue[:FANOUT]:
                send(src, wait, pe)
                told.append((pe, Wait(f"{d}.relay", 1, 0)))
            queue = queue[FANOUT:]
            i += 1


def issue_order(deps: list, est_ps: list) -> list[int]:
    """The order kernels are issued in on every PE: by when their inputs would be ready if
    each kernel took ``est_ps`` (its time alone), program order among equals; a topological
    order (a kernel's estimate is later than its dependencies').

    NOTE: engines are in-order queues: a kernel issued behind one that waits holds up its
    engine; issuing the ready ones first is what a list scheduler does."""
    ready, finish = [], []
    for k, ds in enumerate(deps):
        ready.append(max((finish[d] for d in ds), default=0))
        finish.append(ready[-1] + max(1, est_ps[k]))
    return sorted(range(len(deps)), key=lambda k: (ready[k], k))


def simulate(kernels: list, deps: list, machine, mode: str = "auto", late: list | None = None,
             est_ps: list | None = None, near: list | None = None, snapshots: frozenset = frozenset()) -> Scheduled:
    """Build the joined programs, issued in ``issue_order`` (program order without
    ``est_ps``), and run them in one simulation (symmetry-reduced where the machine's units
    allow); -> ``Scheduled`` (in the given order). ``snapshots``: the marks of commands whose
    counters the run keeps (``Simulator.run``)."""
    if est_ps is not None:
        order = issue_order(deps, est_ps)
        if order != list(range(len(kernels))):
            at = {k: i for i, k in enumerate(order)}
            def moved(sets):
                return [frozenset(at[d] for d in sets[k]) for k in order] if sets else None
            run = simulate([kernels[k] for k in order], moved(deps), machine, mode, moved(late), near=moved(near),
                           snapshots=snapshots)
            back = [at[k] for k in range(len(kernels))]
            return Scheduled(run.result, tuple(run.ready_ps[i] for i in back), tuple(run.finish_ps[i] for i in back),
                             run.commands, tuple(run.chains[i] for i in back))
    programs, commands = build(kernels, deps, machine, late, near)
    mode = graph_mode(mode, commands)
    red = symmetry.reduce(machine, programs)
    finish, chains = [], []
    with simulator(machine, mode=mode, weight=red.weight) as sim:
        result = red.expand(sim.run(red.programs, snapshots), machine)
        for k in range(len(kernels)):
            done = [sim.pe(pe).sem_chain[f"{k}.done"] for pe in red.programs if f"{k}.done" in sim.pe(pe).sem_chain]
            t, chain = max(done, key=lambda d: d[0], default=(0, None))
            finish.append(t)
            chains.append(chain)
    result.programs = programs
    steady.simulated(result, current_fidelity())
    first = min((machine.launch_ps(pe) for pe in programs), default=0)
    ready = [max((finish[d] for d in deps[k]), default=first) for k in range(len(kernels))]
    return Scheduled(result, tuple(ready), tuple(finish), commands, tuple(chains))


def retime(sched: Scheduled, deps: list, delta_ps: list) -> Scheduled:
    """``sched`` (a simulated graph) with kernel ``k``'s span grown by ``delta_ps[k]``, the
    others' spans as simulated, every kernel starting when its dependencies finish (the
    longest path through the graph's dependencies, not a sum): a graph whose kernels changed
    a little since it was simulated (``graph``'s re-timing rule, docs/model.md).

    NOTE: what the simulation measured (each kernel's span under the contention it met)
    stays; only the changed kernels' own latencies move, and they move every kernel after them."""
    ready, finish = [], []
    for k, ds in enumerate(deps):
        ready.append(max((finish[d] for d in ds), default=sched.ready_ps[k]))
        finish.append(ready[-1] + max(0, sched.finish_ps[k] - sched.ready_ps[k] + delta_ps[k]))
    result = copy.copy(sched.result)
    result.latency_ps = max(1, sched.result.latency_ps + max(finish, default=0) - max(sched.finish_ps, default=0))
    # NOTE: the chain still adds up to the latency: the change is shared by the anchor's own
    # attribution (at most ``RETIME_TOLERANCE`` of it moved, so shares move by as much).
    result.chain = steady.resized(sched.result.chain, result.latency_ps)
    # NOTE: the claim: the anchor's own (a periodic graph's) plus the changed kernels' time,
    # simulated alone and not beside the others; the anchor's events all stand in for this run.
    was = sched.result.obtained
    result.obtained = replace(was, method="retimed", events_simulated=0,
                              events_skipped=was.events_simulated + was.events_skipped,
                              error_bound=(was.error_bound * sched.result.latency_ps
                                           + sum(map(abs, delta_ps))) / result.latency_ps)
    return Scheduled(result, tuple(ready), tuple(finish), sched.commands, sched.chains)
