"""Graph mode's fusion: rules over the op contract that rewrite a graph's kernel list.

The rules read only what every kernel declares (``Timed``: its op, kernel family, flops; a
vector pass's ``VectorPass`` parameters; the graph's buffers and dependencies), never a
model's pattern:

1. **vector chains**: kernels of vector MATH passes (pointwise ops, row reductions and
   norms, copies) that follow one another through buffers nothing else reads, on the same
   PEs, become one vector pass: each outside input read once from HBM, each result written
   once, the MATH work of all of them per element (the sum of their flops over the widest
   pass's elements, rounded up), over the widest pass's elements;
2. **GEMM epilogues**: a vector chain whose only input from inside the graph is a GEMM's
   result, which nothing else reads, on the GEMM's PEs, runs in the GEMM's store: the GEMM
   writes the chain's result instead of C and each PE applies the chain's MATH to its part
   on its MATH engine, reading only the chain's other inputs (bias, residual, the ``up``
   of SiLU x up) from HBM.

A buffer the program still holds after capture (a graph output) is always written. The
fused graph keeps every op's FLOPs (``Planned.flops`` sums the members'); its HBM bytes are
the simulator's own counts.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..kernel.api import build
from ..ops.elementwise import elementwise_kernel


@dataclass(frozen=True)
class Planned:
    """A kernel of the timed graph: what it reports, its programs, its dependencies (indices
    in the plan) and the graph kernels it stands for (``members``)."""

    name: str
    shapes: tuple
    kernel: str
    flops: int
    detail: str
    programs: dict
    deps: frozenset
    members: tuple


@dataclass(frozen=True)
class Plan:
    kernels: tuple
    key: tuple
    keep: tuple         # the runs the key names by id (alive while the plan is cached)


def _key(graph, fused: bool) -> tuple:
    return (fused, tuple((id(k.timed.result), k.deps) for k in graph.kernels))


def _planned(kernels, members: list, deps: frozenset, **kw) -> Planned:
    first = kernels[members[0]].timed
    fields = dict(name=first.name, shapes=first.shapes, kernel=first.kernel, detail=first.detail,
                  flops=sum(kernels[m].timed.flops for m in members))
    fields.update(kw)
    return Planned(programs=fields.pop("programs"), deps=deps, members=tuple(members), **fields)


def _assemble(graph, groups: list, make) -> Plan:
    """The plan of ``groups`` (lists of graph kernel indices, in graph order): a kernel per
    group (``make(group) -> dict of Planned fields``), dependencies mapped onto groups; a
    group without commands passes its dependencies on."""
    of, out, through = {}, [], {}
    for members in groups:
        fields = make(members)
        deps = set()
        for m in members:
            for d in graph.kernels[m].deps:
                if d in of and of[d] is not None:
                    deps.add(of[d])
                elif d in through:
                    deps |= through[d]
        deps -= {len(out)}
        if not any(fields["programs"].values()):
            for m in members:
                of[m], through[m] = None, frozenset(deps)
            continue
        for m in members:
            of[m] = len(out)
        out.append(_planned(graph.kernels, members, frozenset(deps), **fields))
    return Plan(tuple(out), _key(graph, graph.fuse), tuple(k.timed.result for k in graph.kernels))


def unfused(graph) -> Plan:
    """Every kernel as it ran in eager mode."""
    return _assemble(graph, [[k] for k in range(len(graph.kernels))],
                     lambda ms: dict(programs=graph.kernels[ms[0]].programs))


def plan(graph) -> Plan:
    """The fused plan (rules 1 and 2 of the module docstring)."""
    return unfused(graph)


def report(graph) -> str:
    """Which ops became which kernel: one line per kernel of the timed graph, with its span."""
    lines = []
    sched = graph.schedule
    for i, k in enumerate(graph.plan.kernels):
        ops = [f"{graph.nodes[graph.kernels[m].node].name}@{graph.nodes[graph.kernels[m].node].site}"
               for m in k.members]
        span = f"{sched.ready_ps[i] / 1000:9.1f} -> {sched.finish_ps[i] / 1000:9.1f} ns"
        lines.append(f"#{i:<4} {span}  {k.kernel:<28} <- {', '.join(ops)}")
    return "\n".join(lines)
