"""A compiled machine: the immutable ``networkx.DiGraph`` of a topology file plus indices.

Time in the simulator is integer picoseconds. Each link carries ``bw_gbps`` and
``prop_ns`` as written in the file, and the derived ``flit_ps`` (one flit's serialisation,
``flit_bytes / bw``, rounded to the nearest ps: 333 ps for 256 B at 768 GB/s) and
``prop_ps``. Each node carries ``overhead_ps`` (its switching cost).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import networkx as nx

from .load import cache, validate
from .errors import TopologyError
from .facts import MachineFacts
from .launch import Launch, segments
from .load.pipeline import Resolved, expand, of_doc, resolve
from .load.overrides import freeze_overrides
from .route.multipath import Paths, RoutingPolicy
from .route.chip import Router
from .load.sources import topology_path
from .system import LEVELS as SYSTEM_LEVELS
from .route.system import SystemRouter
from .load.validate import PE_ROLES

__all__ = ["DEFAULT_MACHINE", "PE", "PE_ROLES", "IssueCost", "Machine", "load_machine", "machine_of_doc", "topology_path"]
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
    validate.check_roles(nodes, names, path)
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
        """``doc``: the document :func:`~kbtorch.topology.load.pipeline.resolve_doc` returned for
        ``path`` and ``overrides`` (already checked: not read or checked again)."""
        self._compile(resolve(path, overrides) if doc is None else of_doc(path, doc))

    @classmethod
    def of(cls, resolved: Resolved) -> "Machine":
        """The machine of a checked document (step 5 of the load path, ``load.pipeline``)."""
        machine = cls.__new__(cls)
        machine._compile(resolved)
        return machine

    def _compile(self, resolved: Resolved) -> None:
        self.doc, self.digest = resolved.doc, resolved.digest
        raw = expand(resolved)
        self.path, self.name = raw.path, raw.machine["name"]
        self.flit_bytes = raw.machine["flit_bytes"]
        self.page_bytes = raw.machine["page_bytes"]
        self.issue = IssueCost(raw.issue["fixed_cycles"], raw.issue["per_byte_cycles"],
                               int(raw.issue["composite_cap_bytes"]), float(raw.machine["clock_ghz"]),
                               dict(raw.issue["descriptor_bytes"]))
        self.graph = self._graph(raw)
        validate.check_graph(self.graph, self.path)
        self.launch = Launch(**raw.launch) if raw.launch is not None else None
        self.pes = [PE(i, p["prefix"], _roles(p["roles"], raw.machine.get("pe_roles", {}), raw.path), p["coords"],
                       p.get("hbm"), p.get("sram")) for i, p in enumerate(raw.pes)]
        validate.check_engines(self.pes, self.graph, raw.machine["pe_block"], self.path)
        route_order, reset = raw.machine["route_order"], raw.machine.get("route_reset", [])
        validate.check_dims(self.graph, route_order, reset, self.path)
        self.system = raw.system
        if self.system is None:
            self.chip = None
            self.router = Router(self.graph, route_order, reset, self.path)
            validate.check_routable(self)
        else:
            self._chip_machine()
        validate.check_routing(raw.routing, self.graph, self.path, self.system is not None)
        self.routing = RoutingPolicy.from_doc(raw.routing)
        self._paths = Paths(self.router, self.routing)
        self._launch = [segments(self, pe.id) for pe in self.pes]

    def _graph(self, raw) -> nx.DiGraph:
        """The frozen graph of the expanded nodes and links, with times in ps."""
        g = nx.DiGraph(name=self.name)
        for name, attrs in raw.nodes.items():
            g.add_node(name, overhead_ps=_ps(attrs["overhead_ns"]), **attrs)
        for (u, v), attrs in raw.edges.items():
            g.add_edge(u, v, flit_ps=max(1, round(self.flit_bytes * 1000 / attrs["bw_gbps"])),
                       prop_ps=_ps(attrs["prop_ns"]), **attrs)
        return nx.freeze(g)

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

    def _chip_machine(self) -> None:
        """A system's chip (``self.chip``, a Machine checked on its own) and its router."""
        lay = self.system
        self.chip = load_machine(lay.chip_path, lay.chip_overrides or None)
        validate.check_chip_levels(self.chip, SYSTEM_LEVELS, self.path, lay.chip_path)
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

    def route(self, src: str, dst: str) -> tuple[str, ...]:
        return self.router.route(src, dst)

    def paths(self, src: str, dst: str) -> tuple:
        """``((path, weight), ...)``: the paths a message's packets are sprayed over under the
        machine's ``[routing]`` policy (``topology.route.multipath``); one path, ``route``, when
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


def machine_of_doc(path: str, doc: dict) -> Machine:
    """The machine of ``path``'s resolved document ``doc`` (checked already): the one this
    process has for that content, else a new one (not checked again)."""
    digest = cache.content_digest(doc)
    return cache.get(("machine", path, digest), lambda: Machine.of(of_doc(path, doc, digest)))


def load_machine(name_or_path: str = DEFAULT_MACHINE, overrides: dict | None = None) -> Machine:
    """Load (once per content: the bytes of every file read, and the overrides) and return the
    compiled machine: the same object for the same content, so a file touched (new mtime,
    same bytes) is the same machine and an edit to a system's chip file a new one. The load
    path is written down in :mod:`kbtorch.topology.load.pipeline`.

    ``overrides`` maps dotted paths of the file to values (``{"links.noc.bw_gbps": 512}``);
    see docs/topology-format.md."""
    path = topology_path(name_or_path)
    if not os.path.exists(path):
        raise TopologyError(path, "file", "no such topology file")
    freeze_overrides(overrides, path)               # NOTE: refuses overrides that are not plain data
    resolved = resolve(os.path.abspath(path), overrides)
    return cache.get(("machine", resolved.path, resolved.digest), lambda: Machine.of(resolved))
