"""Graph mode's scheduler: the kernels of a graph as ONE program per PE, run in ONE simulation.

Every kernel keeps the per-PE command programs its op family built (``RunResult.programs``)
on the PEs its op chose (placement policy ``share``, see docs/model.md "Graph mode"); the
scheduler only joins them, in the graph's order, and chains them by semaphores on the PEs,
in the SDLA style of Maia 200 (no host round trip between kernels):

- each kernel's semaphores are renamed apart (``"<k>.<name>"``), so kernels never share one;
- on every PE, the last command of each engine a kernel uses raises ``"<k>.done"`` (a
  1-byte FETCH on that engine carries it when that command already raises two semaphores);
- a kernel waits, on each PE, for each kernel it depends on: on the same PE through that
  ``done`` semaphore (level: threshold = its engines there, no decrement); on a PE the
  producer does not use, through one IPCQ message from one of the producer's PEs (a relay);
- the waits go on the first command of each engine the kernel uses on that PE, or, beyond
  the two waits a command takes, on 1-byte FETCH gates just before it on that engine.

The whole graph is one kernel launch (``Simulator.run``): each PE's command processor issues
every command of every kernel, in order, paying command issue for each; engines are in-order
queues, so kernels that share a PE share its engines, and kernels everywhere share links,
routers and HBM channels, all simulated together. Symmetry reduction applies to the joined
programs as to any kernel's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..sim import symmetry
from ..sim.commands import Fetch, Send, Signal, Wait
from ..sim.simulator import Simulator

COMPUTE = ("gemm", "math")


@dataclass(frozen=True)
class Scheduled:
    """A simulated graph: the run, and each kernel's span (ps from the graph's launch):
    ``ready_ps`` when the last kernel it depends on finished (its launch reaching its first
    PE for a kernel without any), ``finish_ps`` when its last PE finished it."""

    result: object
    ready_ps: tuple
    finish_ps: tuple
    commands: int

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


def _gated(cmds: list, waits: list, k: int) -> list:
    """``cmds`` with ``waits`` before the first command of each engine: on that command, or
    on gates before it on its engine; a DMA or IPCQ command without room for them waits
    for ``"<k>.go"``, raised by gates on the MATH engine that wait for them."""
    if not waits:
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


def build(kernels: list, deps: list, machine) -> tuple[dict, int]:
    """The joined programs ``{pe: [commands]}`` of ``kernels`` (each a ``{pe: [commands]}``)
    where kernel ``k`` depends on the kernels ``deps[k]`` (earlier ones); -> (programs,
    commands)."""
    programs: dict = {}
    engines: dict = {}          # (kernel, pe) -> engines raising its done semaphore there
    relays: set = set()
    pes_of = []
    for k, prog in enumerate(kernels):
        pes = [pe for pe in sorted(prog) if prog[pe]]
        pes_of.append(pes)
        for pe in pes:
            waits = []
            for d in sorted(deps[k]):
                if not pes_of[d]:
                    continue
                if (d, pe) in engines:
                    waits.append(Wait(f"{d}.done", engines[(d, pe)], 0))
                    continue
                if (d, pe) not in relays:
                    src = pes_of[d][pe % len(pes_of[d])]
                    relays.add((d, pe))
                    programs.setdefault(src, []).append(
                        Send(dst_pe=pe, sem=f"{d}.relay", waits=(Wait(f"{d}.done", engines[(d, src)], 0),),
                             label=f"kernel {d} done: relay to PE {pe}"))
                waits.append(Wait(f"{d}.relay", 1, 0))
            cmds = [_rename(c, f"{k}.") for c in prog[pe]]
            cmds, engines[(k, pe)] = _finish_signals(cmds, k)
            programs.setdefault(pe, []).extend(_gated(cmds, waits, k))
    return programs, sum(len(v) for v in programs.values())


def simulate(kernels: list, deps: list, machine, mode: str = "fast") -> Scheduled:
    """Build the joined programs and run them in one simulation (symmetry-reduced where the
    machine's units allow); -> ``Scheduled``."""
    programs, commands = build(kernels, deps, machine)
    red = symmetry.reduce(machine, programs)
    sim = Simulator(machine, mode=mode, weight=red.weight)
    result = red.expand(sim.run(red.programs), machine)
    result.programs = programs
    finish = []
    for k in range(len(kernels)):
        times = [sim.pe(pe).sem_chain[f"{k}.done"][0] for pe in red.programs
                 if f"{k}.done" in sim.pe(pe).sem_chain]
        finish.append(max(times, default=0))
    first = min((machine.launch_ps(pe) for pe in programs), default=0)
    ready = [max((finish[d] for d in deps[k]), default=first) for k in range(len(kernels))]
    return Scheduled(result, tuple(ready), tuple(finish), commands)
