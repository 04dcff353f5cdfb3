"""A compiled machine: the immutable ``networkx.DiGraph`` of a topology file plus indices.

Time in the simulator is integer picoseconds. Each link carries ``bw_gbps`` and
``prop_ns`` as written in the file, and the derived ``flit_ps`` (one flit's serialisation,
``flit_bytes / bw``, rounded to the nearest ps: 333 ps for 256 B at 768 GB/s) and
``prop_ps``. Each node carries ``overhead_ps`` (its switching cost).
"""
from __future__ import annotations

import functools
import os
import weakref
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from .errors import TopologyError, did_you_mean
from .facts import MachineFacts
from .launch import Launch, segments
from .loader import TOPOLOGY_DIR, load_raw, resolve_doc, topology_dirs
from .overrides import freeze_overrides, thaw_overrides
from .multipath import Paths, RoutingPolicy
from .routing import Router
from .sources import sources_stamp
from .system import LEVELS as SYSTEM_LEVELS
from .system_route import SystemRouter
from .validate import content_digest

#: Engines every PE block must define (the tile-kernel API's model of a PE).
PE_ROLES = ("cp", "sched", "dma_rd", "dma_wr", "gemm", "math", "tcm", "ipcq")
#: The links inside a PE that its engines' data crosses (DMA into and out of the TCM, the
#: GEMM and MATH engines' operands and results), checked at load time.
PE_DATA_LINKS = (("dma_rd", "tcm"), ("tcm", "dma_wr"), ("tcm", "gemm"), ("gemm", "tcm"), ("tcm", "math"), ("math", "tcm"))
#: The machine every entry point uses when none is named (``use``, $KBTORCH_TOPOLOGY, the
#: command line's ``--topology``, a sweep's ``topology``).
DEFAULT_MACHINE = "ahbm"


@dataclass(frozen=True, eq=False)
class IssueCost:
    """Command-issue cost ``d_cmd = FIXED + b_logical * R`` cycles at ``clock_ghz``, with the
    hardware-logical descriptor size ``b_logical`` of each command kind (``descriptor_bytes``)."""

    fixed_cycles: float
    per_byte_cycles: float
    composite_cap_bytes: int
    clock_ghz: float
    descriptor_bytes: dict

    def cmd_ps(self, logical_bytes: int) -> int:
        cycles = self.fixed_cycles + logical_bytes * self.per_byte_cycles
        return round(cycles * 1000 / self.clock_ghz)

    def descriptor(self, kind: str, moves: int = 0, stages: int = 0) -> int:
        """Descriptor bytes of a ``kind`` command (``dma``, ``compute``, ``send``, ``fetch``,
        ``store``); a ``composite`` adds ``moves`` read/write moves and ``stages`` engine stages."""
        d = self.descriptor_bytes
        if kind == "composite":
            return d["composite"] + d["move"] * moves + d["stage"] * stages
        return d[kind]

    def kind_ps(self, kind: str, moves: int = 0, stages: int = 0) -> int:
        """Issue cost of a ``kind`` command (see ``descriptor``)."""
        return self.cmd_ps(self.descriptor(kind, moves, stages))


@dataclass(frozen=True)
class PE:
    """One processing element: its id, its engines by role, its coordinates and memories."""

    id: int
    prefix: str
    roles: dict
    coords: dict
    hbm: str | None
    sram: str | None

    def node(self, role: str) -> str:
        return self.roles[role]


def _roles(nodes: dict, names: dict, path: str) -> dict:
    """A PE's engines by role: ``pe_roles`` (``[machine]``) names the node of a role inside
    the PE block where the node is not named after the role; two roles may share a node."""
    for role, local in names.items():
        if local not in nodes:
            raise TopologyError(path, f"machine.pe_roles.{role}", f"names '{local}', which is not a node of the PE "
                                f"block (its nodes: {', '.join(sorted(nodes))})")
    return {**nodes, **{role: nodes[local] for role, local in names.items()}}


def _ps(ns: float) -> int:
    return round(ns * 1000)


class Machine(MachineFacts):
    """A topology compiled once into a frozen DiGraph; never mutated during a run; the only
    source of hardware facts (``MachineFacts``).

    NOTE: a machine IS its resolved content (the file's document with the overrides applied):
    two Machines of the same content are equal (``digest``), whatever the file's path or
    mtime; copies and pickles are the same machine (``copy.deepcopy`` returns it, unpickling
    finds it again in the process), so tensors and modules copied on ``ahbm`` still mix."""

    def __init__(self, path: str, overrides: dict | None = None, *, doc: dict | None = None):
        """``doc``: the document :func:`~kbtorch.topology.loader.resolve_doc` returned for
        ``path`` and ``overrides`` (already checked: not read or checked again)."""
        doc = resolve_doc(path, overrides) if doc is None else doc
        self.doc, self.digest = doc, content_digest(doc)
        raw = load_raw(path, doc=doc)
        self.path, self.name = raw.path, raw.machine["name"]
        self.flit_bytes = raw.machine["flit_bytes"]
        self.page_bytes = raw.machine["page_bytes"]
        self.issue = IssueCost(raw.issue["fixed_cycles"], raw.issue["per_byte_cycles"],
                               int(raw.issue["composite_cap_bytes"]), float(raw.machine["clock_ghz"]),
                               dict(raw.issue["descriptor_bytes"]))
        g = nx.DiGraph(name=self.name)
        for name, attrs in raw.nodes.items():
            g.add_node(name, overhead_ps=_ps(attrs["overhead_ns"]), **attrs)
        for (u, v), attrs in raw.edges.items():
            g.add_edge(u, v, flit_ps=max(1, round(self.flit_bytes * 1000 / attrs["bw_gbps"])),
                       prop_ps=_ps(attrs["prop_ns"]), **attrs)
        self.graph = nx.freeze(g)
        for name, d in g.nodes(data=True):
            if d["params"].get("multicast") and not d["transit"]:
                raise TopologyError(self.path, f"components ({name})",
                                    "multicast = true needs transit = true: only a node that forwards traffic "
                                    "replicates it")
        self.launch = Launch(**raw.launch) if raw.launch is not None else None
        self.pes = [PE(i, p["prefix"], _roles(p["roles"], raw.machine.get("pe_roles", {}), raw.path), p["coords"],
                       p.get("hbm"), p.get("sram")) for i, p in enumerate(raw.pes)]
        for pe in self.pes:
            missing = [r for r in PE_ROLES if r not in pe.roles]
            if missing:
                raise TopologyError(self.path, f"blocks.{raw.machine['pe_block']}", f"PE {pe.id} lacks engines {missing}")
            lost = [f"{a} -> {b}" for a, b in PE_DATA_LINKS if not g.has_edge(pe.node(a), pe.node(b))]
            if lost:
                raise TopologyError(self.path, f"blocks.{raw.machine['pe_block']}.links", f"PE {pe.id} has no link "
                                    f"{', '.join(lost)}: its engines move data to and from its TCM over them")
        route_order = raw.machine["route_order"]
        reset = raw.machine.get("route_reset", [])
        dims = {d["dim"] for _, _, d in g.edges(data=True) if d["dim"] is not None}
        unknown = sorted((set(route_order) | set(reset)) - dims)
        if unknown:
            raise TopologyError(self.path, "machine.route_order", f"dimensions {unknown} label no link (have {sorted(dims)})")
        stray = sorted(set(reset) - set(route_order))
        if stray:
            raise TopologyError(self.path, "machine.route_reset", f"dimensions {stray} are not in route_order")
        self.system = raw.system
        if self.system is None:
            self.chip = None
            self.router = Router(self.graph, route_order, reset, self.path)
            self._check_routable()
        else:
            self._chip_machine(raw)
        self.routing = RoutingPolicy.from_doc(raw.routing, self.graph, self.path)
        self._paths = Paths(self.router, self.routing)
        self._launch = [segments(self, pe.id) for pe in self.pes]

    def __eq__(self, other) -> bool:
        return self is other or (isinstance(other, Machine) and self.digest == other.digest)

    def __hash__(self) -> int:
        return hash(self.digest)

    def __copy__(self) -> "Machine":
        return self

    def __deepcopy__(self, memo) -> "Machine":
        return self

    def __reduce__(self):
        return (machine_of_doc, (self.path, self.doc))

    def _chip_machine(self, raw) -> None:
        """A system's chip (``self.chip``, a Machine checked on its own) and its router."""
        lay = self.system
        self.chip = load_machine(lay.chip_path, lay.chip_overrides or None)
        clash = sorted(set(self.chip.pes[0].coords) & set(SYSTEM_LEVELS))
        if clash:
            raise TopologyError(self.path, "system.chip", f"the chip file {lay.chip_path} has its own dimension "
                                f"{clash[0]!r}; a system adds {', '.join(SYSTEM_LEVELS)} above the chip")
        self.router = SystemRouter(self.graph, self.chip.router, lay, self.path)

    @property
    def chips(self) -> int:
        """How many chips: a system's, else 1."""
        return 1 if self.system is None else self.system.chips

    def chip_of(self, pe: int) -> int:
        """The chip of PE ``pe`` (0 on a single chip); chips are numbered chip-major."""
        return 0 if self.system is None else pe // len(self.chip.pes)

    def launch_segments(self, pe: int) -> tuple:
        """``((element, ps), ...)``: how PE ``pe``'s program start is reached (``topology.launch``;
        empty without a ``[launch]`` section: the program starts at t = 0)."""
        return self._launch[pe]

    def launch_ps(self, pe: int) -> int:
        """When PE ``pe``'s program starts (ps after the kernel is launched)."""
        return sum(ps for _, ps in self._launch[pe])

    def _check_routable(self) -> None:
        """Every PE reaches every other PE and its own memories; fail at load time if not."""
        # NOTE: the same checks as one search per PE, answered from one reachability pass
        # (routing.Reach); Router.route runs only to report a memory that is unroutable.
        g = self.graph
        ports = [(pe.node("dma_wr"), pe.node("dma_rd")) for pe in self.pes]
        entries = list(dict.fromkeys(self._port(rd, "in") for _, rd in ports))
        ends = [r for pe in self.pes for n in (pe.node("dma_rd"), pe.hbm) if n for r in g.predecessors(n)
                if g.nodes[r]["transit"]]
        reach = self.router.reach(entries + ends)
        need = reach.mask(entries)
        for wr, _ in ports:
            got = reach.from_node(self._port(wr, "out"))
            if got & need != need:
                lost = next(e for e in entries if not got & reach.bit[e])
                raise TopologyError(self.path, "route", f"PE {g.nodes[wr]['pe']} ('{wr}') cannot reach '{lost}'")
        for pe in self.pes:
            for src, dst in ((pe.hbm, pe.node("dma_rd")), (pe.node("dma_wr"), pe.hbm)):
                if pe.hbm and not reach.routable(src, dst):
                    self.route(src, dst)

    def _port(self, node: str, way: str) -> str:
        """The first transit node after (``out``) or before (``in``) an endpoint."""
        g = self.graph
        near = g.successors(node) if way == "out" else g.predecessors(node)
        transit = [r for r in near if g.nodes[r]["transit"]]
        if not transit:
            raise TopologyError(self.path, "route", f"'{node}' (PE {g.nodes[node].get('pe')}) is disconnected: no link {'to' if way == 'out' else 'from'} the network")
        return transit[0]

    def route(self, src: str, dst: str) -> tuple[str, ...]:
        return self.router.route(src, dst)

    def paths(self, src: str, dst: str) -> tuple:
        """``((path, weight), ...)``: the paths a message's packets are sprayed over under the
        machine's ``[routing]`` policy (``topology.multipath``); one path, ``route``, when
        single-path."""
        return self._paths.paths(src, dst)

    @property
    def multipath(self) -> bool:
        return self.routing.policy != "single"

    def node(self, name: str) -> dict:
        return self.graph.nodes[name]

    def summary(self) -> dict:
        """Counts and peaks for ``kbtorch topo``."""
        g = self.graph
        nodes, edges, links = {}, {}, {}
        for _, d in g.nodes(data=True):
            nodes[d["kind"]] = nodes.get(d["kind"], 0) + 1
        for _, _, d in g.edges(data=True):
            edges[d["kind"]] = edges.get(d["kind"], 0) + 1
            entry = links.setdefault(d["link"], {"kind": d["kind"], "bw_gbps": d["bw_gbps"], "prop_ns": d["prop_ns"], "edges": 0})
            entry["edges"] += 1
        peaks = {dtype: self.peak_tflops(dtype) for dtype in self.dtypes()}
        hbm = [n for n, d in g.nodes(data=True) if d["kind"] == "hbm"]
        sram = [n for n, d in g.nodes(data=True) if d["kind"] == "sram"]
        hbm_gbps = self.hbm_gbps([pe.id for pe in self.pes if pe.hbm])
        return {
            "name": self.name, "path": self.path, "pes": len(self.pes),
            "nodes": len(g), "edges": g.number_of_edges(),
            "nodes_by_kind": dict(sorted(nodes.items())), "edges_by_kind": dict(sorted(edges.items())),
            "peak_tflops": peaks, "hbm_gbps_total": hbm_gbps,
            "hbm_channels": sum(g.nodes[n]["params"].get("channels", 0) for n in hbm),
            "hbm_gib_total": sum(self.node_capacity(n) for n in hbm) / 2**30,
            "sram_mib_total": sum(self.node_capacity(n) for n in sram) / 2**20,
            "links": dict(sorted(links.items())),
            **({} if self.system is None else {"chips": self.chips, "chip": self.chip.name,
                                                "trays": self.system.trays, "chips_per_tray": self.system.per_tray,
                                                "switches": {t.name: t.count for t in self.system.tiers}}),
        }


def topology_path(name_or_path: str) -> str:
    """A name (``ahbm``) found in KBTORCH_TOPOLOGIES or the shipped topologies (``TOPOLOGY_DIR``), or a path."""
    if name_or_path.endswith(".toml") or os.sep in name_or_path:
        return name_or_path
    dirs = topology_dirs()
    for d in dirs:
        candidate = Path(d) / f"{name_or_path}.toml"
        if candidate.exists():
            return str(candidate)
    known = sorted(p.stem for d in dirs if Path(d).is_dir() for p in Path(d).glob("*.toml"))
    raise TopologyError(name_or_path, "name",
                        f"unknown topology (known: {', '.join(known)}){did_you_mean(name_or_path.strip(), known)}")


#: Machines by (path, content digest): one object per content in a process.
_BY_CONTENT: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def machine_of_doc(path: str, doc: dict) -> Machine:
    """The machine of ``path``'s resolved document ``doc`` (checked already): the one this
    process has for that content, else a new one (not checked again)."""
    key = (path, content_digest(doc))
    machine = _BY_CONTENT.get(key)
    if machine is None:
        machine = _BY_CONTENT[key] = Machine(path, doc=doc)
    return machine


@functools.lru_cache(maxsize=16)
def _load_cached(path: str, stamp: tuple, overrides: tuple) -> Machine:
    return machine_of_doc(path, resolve_doc(path, thaw_overrides(overrides)))


def load_machine(name_or_path: str = DEFAULT_MACHINE, overrides: dict | None = None) -> Machine:
    """Load (once per file version and overrides) and return the compiled machine: the same
    object for the same content, so a file touched (new mtime, same bytes) is the same machine.

    ``overrides`` maps dotted paths of the file to values (``{"links.noc.bw_gbps": 512}``);
    see docs/topology-format.md."""
    path = topology_path(name_or_path)
    if not os.path.exists(path):
        raise TopologyError(path, "file", "no such topology file")
    # NOTE: cached per version of every file the machine reads (a system's chip file too).
    return _load_cached(os.path.abspath(path), sources_stamp(path), freeze_overrides(overrides, path))
