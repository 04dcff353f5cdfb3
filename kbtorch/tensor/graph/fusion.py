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
   of SiLU x up) from HBM;
3. **norm prologues**: an RMSNorm (the ``rms_norm`` op or its decomposed chain, ending a
   vector chain or alone) whose result only GEMMs read, as their A operand, with nothing
   between (no collective), runs in those GEMMs: each GEMM PE computes its A rows' statistics on its MATH engine as
   the A panel streams in (the norm's MATH work over the rows it loads; every reader does
   it, as a fused QKV kernel's prologue would) and scales its result rows (gamma folded in
   as A is loaded): the GEMMs read the norm's input instead of its result (the same
   bytes), the normalized tensor is never written nor read back. The rest of the chain
   (a residual add before the norm) stays a vector pass, writing what it wrote.

A buffer the program still holds after capture (a graph output) is always written. The
fused graph keeps every op's FLOPs (``Planned.flops`` sums the members'); its HBM bytes are
the simulator's own counts.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..timing import VectorPass
from .gemm_fused import epilogue, prologue


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
    late: frozenset = frozenset()       # dependencies only its MATH engine waits for (an epilogue's operands)
    epilogue: tuple = ()                # a GEMM epilogue's arguments after ``graph, gemm`` (``epilogue``)
    vector: VectorPass | None = None    # a fused vector pass's parameters


@dataclass(frozen=True)
class Plan:
    kernels: tuple
    key: tuple
    keep: tuple         # the runs the key names by id (alive while the plan is cached)


def key(graph) -> tuple:
    """What a graph's timing depends on: its kernels' runs (by id: the plan keeps them
    alive), their dependencies, fusion on or off (``live`` buffers decide what is written)."""
    return (graph.fuse, tuple((id(k.timed.result), k.deps) for k in graph.kernels), tuple(sorted(_escaping(graph))))


def shape_key(graph) -> tuple:
    """What two graphs that differ only in some kernels' shapes share (decode steps with a
    growing KV cache): fusion on or off, each kernel's op and kind, the dependencies, what
    escapes, and of a vector pass its op, operands, dtype and whether it is pointwise (not
    its length, nor its PEs: a pass split over its tensor's rows, such as one over a growing
    attention mask, takes more PEs each step; the re-timed graph keeps the simulated one's
    fusion groups)."""
    def groups_by(v):
        return v and (v.op, v.inputs, v.dtype, v.elem_bytes, v.out_ratio == 1)
    return (graph.fuse, tuple((k.timed.name, k.timed.kernel, k.deps, groups_by(getattr(k.timed.result, "vector", None)))
                              for k in graph.kernels), tuple(sorted(_escaping(graph))))


def _escaping(graph) -> set:
    """Kernels whose results the program holds after capture or an op without a kernel
    reads (always written)."""
    read_bare = {r for r, ks in graph.readers.items() if -1 in ks}
    return {i for i, k in enumerate(graph.kernels) if k.writes & (graph.live_roots | read_bare)}


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
        deps, head = set(), set()
        for m in members:
            for d in graph.kernels[m].deps:
                if d not in of and d not in members:
                    raise AssertionError(f"graph fusion: kernel {m} is planned before kernel {d} it depends on")
                got = {of[d]} if of.get(d) is not None else set(through.get(d, ()))
                deps |= got
                if m == members[0]:
                    head |= got
        deps -= {len(out)}
        if not any(fields["programs"].values()):
            for m in members:
                of[m], through[m] = None, frozenset(deps)
            continue
        for m in members:
            of[m] = len(out)
        late = frozenset(deps - head) if fields.get("kernel") == "gemm+epilogue" else frozenset()
        out.append(_planned(graph.kernels, members, frozenset(deps), late=late, **fields))
    return Plan(tuple(out), key(graph), tuple(k.timed.result for k in graph.kernels))


def unfused(graph) -> Plan:
    """Every kernel as it ran in eager mode."""
    return _assemble(graph, [[k] for k in range(len(graph.kernels))],
                     lambda ms: dict(programs=graph.kernels[ms[0]].programs))


def _ancestors(graph) -> list[int]:
    """Bit sets: kernel k's transitive dependencies."""
    out = []
    for k in graph.kernels:
        bits = 0
        for d in k.deps:
            bits |= out[d] | (1 << d)
        out.append(bits)
    return out


def _produced(graph, k: int) -> frozenset:
    """The buffers kernel ``k``'s results go to: its node's outputs for the node's last
    kernel, else a private buffer of its own (read by the node's next kernel only)."""
    kern = graph.kernels[k]
    node = graph.nodes[kern.node]
    return kern.writes if k == node.kernels[-1] else frozenset((("private", k),))


def _read(graph, k: int) -> frozenset:
    node = graph.nodes[graph.kernels[k].node]
    return graph.kernels[k].reads if k == node.kernels[0] else frozenset((("private", k - 1),))


def groups(graph) -> list[list[int]]:
    """Fusion groups (rules 1 and 2): each a list of graph kernels, in graph order, ordered by
    their last member."""
    anc = _ancestors(graph)
    group_of: dict = {}
    members: dict = {}
    # NOTE: a group a kernel outside it already depends on is closed: a later member would put
    # the group (ordered by its last member) after that kernel, which would run before the
    # results it waits for (the tiny Llama's rotary tables, read by the q path, joined by the
    # k path's mul at batch 1: docs/model.md "Fusion").
    closed: set = set()
    for k, kern in enumerate(graph.kernels):
        vec = getattr(kern.timed.result, "vector", None)
        if vec is not None:
            for g in _candidates(graph, k, group_of, members):
                if g not in closed and _fits(graph, members[g], k, vec) and _acyclic(anc, members[g], kern.deps, k):
                    group_of[k] = g
                    members[g].append(k)
                    break
        if k not in group_of:
            group_of[k] = k
            members[k] = [k]
        closed.update(group_of[d] for d in kern.deps if group_of[d] != group_of[k])
    return sorted(members.values(), key=lambda m: m[-1])


def _candidates(graph, k: int, group_of: dict, members: dict) -> list:
    """Groups that made a buffer kernel ``k`` reads (nearest first)."""
    reads = _read(graph, k)
    found = []
    for d in sorted(graph.kernels[k].deps, reverse=True):
        if _produced(graph, d) & reads and group_of[d] not in found:
            found.append(group_of[d])
    return found


def _fits(graph, group: list, k: int, vec) -> bool:
    """A vector pass joins a vector chain on the same PEs, or a GEMM's epilogue on its PEs."""
    head = graph.kernels[group[0]].timed
    if head.kernel == "gemm":
        # NOTE: pointwise only: a row reduction needs whole rows, which a GEMM's PE may not hold.
        # A replicated pass (each of its PEs computes all of it) fits any GEMM: each GEMM PE
        # computes its copy; a split one only a GEMM on all its PEs (its work stays whole).
        pes = {pe for pe, cmds in (head.result.programs or {}).items() if cmds}
        placed = vec.copies == len(vec.pes) or set(vec.pes) <= pes
        return placed and vec.out_ratio == 1 and graph.kernels[k].timed.kernel.startswith("elementwise")
    first = getattr(head.result, "vector", None)
    return first is not None and first.pes == vec.pes


def _acyclic(anc: list, group: list, deps, k: int) -> bool:
    """No kernel outside the group lies between a member and ``k`` (fusing would make a cycle)."""
    mask = sum(1 << m for m in group)
    return all(d in group or not (anc[d] & mask) for d in deps)


def plan(graph) -> Plan:
    """The fused plan (rules 1 to 3 of the module docstring)."""
    return prologues(graph, _assemble(graph, groups(graph), lambda ms: _fused(graph, ms)))


#: The ops of a norm: the ``rms_norm`` op, or its decomposed chain (which must hold a row
#: mean and a reciprocal square root).
NORMS = ("aten::rms_norm",)
NORM_CHAIN = ("aten::_to_copy", "aten::pow", "aten::mean", "aten::add", "aten::rsqrt", "aten::mul")
#: GEMMs whose A operand a norm prologue may feed (the norm's result is their activation).
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::linear")


def _norm_tail(graph, group: tuple) -> list | None:
    """The members of a vector group after the last result it writes before its final one:
    when they are a norm (rule 3), else None."""
    _, outs = _io(graph, list(group))
    cut = max((group.index(m) for m in outs if m != group[-1]), default=-1)
    tail = list(group[cut + 1:])
    names = [graph.nodes[graph.kernels[m].node].name for m in tail]
    if names == list(NORMS[:1]) or (set(names) <= set(NORM_CHAIN) and {"aten::mean", "aten::rsqrt"} <= set(names)):
        return tail if all(getattr(graph.kernels[m].timed.result, "vector", None) for m in tail) else None
    return None


def _norm_readers(graph, plan: Plan, i: int, users: dict):
    """(the norm's members, its GEMM readers) when plan kernel ``i`` ends in a norm whose
    result only GEMMs read (rule 3), else None."""
    k = plan.kernels[i]
    last = graph.kernels[k.members[-1]]
    if not (k.kernel == "fused vector" or k.kernel.startswith("vector ")) \
            or graph.nodes[last.node].kernels != [k.members[-1]]:
        return None
    tail = _norm_tail(graph, k.members)
    out = last.writes
    # NOTE: an op without a kernel reading it (-1) is a view of it (a reshape for the GEMM): its
    # readers read the same buffer and are counted here.
    readers = graph.readers.get(next(iter(out)), set()) - {-1} if len(out) == 1 else set()
    if tail is None or not readers or out & graph.live_roots:
        return None
    gemms = [u for u in users.get(i, ()) if plan.kernels[u].members[0] in readers]
    if {plan.kernels[u].members[0] for u in gemms} != readers:
        return None
    for u in gemms:
        head = graph.kernels[plan.kernels[u].members[0]]
        if plan.kernels[u].kernel not in ("gemm", "gemm+epilogue") or head.timed.kernel != "gemm" \
                or graph.nodes[head.node].name not in GEMM_OPS:
            return None
    return tail, gemms


def prologues(graph, plan: Plan) -> Plan:
    """Rule 3 (module docstring) on the assembled plan."""
    users: dict = {}
    for i, k in enumerate(plan.kernels):
        for d in k.deps:
            users.setdefault(d, []).append(i)
    kernels, gone = list(plan.kernels), {}
    for i in range(len(kernels)):
        got = _norm_readers(graph, plan, i, users)
        if got is None:
            continue
        tail, gemms = got
        k = kernels[i]
        rest = [m for m in k.members if m not in tail]
        work = sum(graph.kernels[m].timed.flops for m in tail)
        if rest:
            fields = {"vector": None, **_fused(graph, rest)}
            fields.setdefault("kernel", graph.kernels[rest[0]].timed.kernel if len(rest) == 1 else k.kernel)
            kernels[i] = replace(k, members=tuple(rest), flops=k.flops - work,
                                 **{f: v for f, v in fields.items() if f != "epilogue"})
        else:
            gone[i] = k.deps
        vecs = [graph.kernels[m].timed.result.vector for m in tail]
        for j, u in enumerate(gemms):
            g = kernels[u]
            kernels[u] = replace(g, programs=prologue(g.programs, vecs),
                                 members=(tuple(tail) if j == 0 else ()) + g.members,
                                 flops=g.flops + (work if j == 0 else 0),
                                 kernel=g.kernel.replace("gemm", "norm+gemm", 1), detail=f"{g.detail}; prologue norm")
    if not gone:
        return Plan(tuple(kernels), plan.key, plan.keep)
    at, out = {}, []
    for i, k in enumerate(kernels):
        if i in gone:
            continue
        at[i] = len(out)
        deps = set()
        for d in k.deps:
            deps |= {at[e] for e in gone[d]} if d in gone else {at[d]}
        out.append(replace(k, deps=frozenset(deps), late=frozenset(at[d] for d in k.late if d in at)))
    return Plan(tuple(out), plan.key, plan.keep)


def _io(graph, group: list) -> tuple[list, list]:
    """(buffers the group reads from outside, the members whose results leave the group:
    read by a kernel outside it or by an op without a kernel, or held after capture)."""
    inside = set(group)
    made = set().union(*(_produced(graph, m) for m in group))
    ins = sorted({r for m in group for r in _read(graph, m) if r not in made}, key=str)
    outs = []
    for m in group:
        for r in _produced(graph, m):
            if isinstance(r, tuple):
                leaves = m + 1 not in inside
            else:
                leaves = r in graph.live_roots or bool(graph.readers.get(r, set()) - inside)
            if leaves:
                outs.append(m)
                break
    return ins, outs


def _fused(graph, group: list) -> dict:
    if len(group) == 1:
        return dict(programs=graph.kernels[group[0]].programs)
    head = graph.kernels[group[0]].timed
    vecs = [graph.kernels[m].timed.result.vector for m in group if head.kernel != "gemm" or m != group[0]]
    ins, outs = _io(graph, group)
    n = max(v.n for v in vecs)
    eb = max(v.elem_bytes for v in vecs)
    flops = -(-sum(v.n * v.flops for v in vecs) // n)
    written = [graph.kernels[m].timed.result.vector for m in outs if m != group[0] or head.kernel != "gemm"]
    names = "+".join(graph.nodes[graph.kernels[m].node].name.removeprefix("aten::") for m in group)
    if head.kernel == "gemm":
        # NOTE: the GEMM's store writes the chain's last result in place of C.
        extra = max(0, len(written) - (0 if group[0] in outs else 1))
        ratio = sum(v.n * v.out_ratio for v in written[:extra]) / n
        args = (vecs[-1], n, max(0, len(ins) - 2), eb, flops, ratio)
        return dict(programs=epilogue(graph.machine, head, *args), kernel="gemm+epilogue",
                    detail=f"{head.detail}; epilogue {names}", epilogue=args)
    vec, eb = vecs[-1], max(vecs, key=lambda v: v.n).elem_bytes
    pes = list(vec.pes)[:max(1, min(len(vec.pes), n))]
    streams, ratio = _streams(graph, group, ins, outs, n, eb)
    copies = len(pes) if all(v.copies == len(v.pes) for v in vecs) else 1
    fused = VectorPass(names, n, tuple(pes), streams, vec.dtype, eb, flops, max(ratio, 1 / n), copies)
    return dict(programs=fused.programs(graph.machine, name=f"fused {names}"), kernel="fused vector", vector=fused,
                detail=f"{len(group)} passes, {len(ins)} input(s), {len(outs)} output(s)")


def _streams(graph, group: list, ins: list, outs: list, n: int, eb: int) -> tuple[int, float]:
    """(input streams, output ratio) of a fused chain's pass over ``n`` elements of ``eb``
    bytes carrying the bytes its members move from and to HBM: each outside buffer read
    once, at its first reader's width and length, and each result that leaves written once.

    NOTE: members differ in length and width (a scalar int64 position beside a KV-cache
    copy): streaming every input at the widest width and longest length would move more than
    the unfused passes did."""
    outside, read = set(ins), 0
    for m in group:
        v = graph.kernels[m].timed.result.vector
        for buf in sorted(_read(graph, m) & outside, key=str):
            read += v.n * v.elem_bytes
            outside.discard(buf)
    wrote = sum(v.n * v.out_ratio * v.elem_bytes for v in (graph.kernels[m].timed.result.vector for m in outs))
    return max(1, round(read / (n * eb))), wrote / (n * eb)


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


def signatures(graph, plan: Plan) -> list:
    """Per planned kernel, what it runs (its members' runs, its kind) and the kernels it
    depends on (indices in the plan): kernels that run the same and depend on their
    counterparts one block back, or on the same kernel (an input every block shares, such as
    a model's rotary tables), mark a model's layers (``periodic.period``)."""
    return [((tuple(id(graph.kernels[m].timed.result) for m in k.members), k.kernel), k.deps)
            for k in plan.kernels]
