"""Step 3 of loading (see ``pipeline``): every check of a topology, in the order they run.

- the schema (``validate``: a parsed document against kbtorch/topology/load/schema.py). The walk
  follows the schema, never the document, so its depth is the schema's: a document nested a
  thousand levels deep is refused at the first level that expects something else;
- a system's chip file (``check_chip``) and the names and references of a system
  (``check_system_names``, ``known``, ``check_switch_refs``, ``check_ports_used``, ``check_reach``);
- blocks, nesting and size before expanding (``check_blocks``, ``check_size``);
- the expanded machine (``check_pes`` and, on its graph, ``check_graph``, ``check_engines``,
  ``check_dims``, ``check_chip_levels``, ``check_routable``, ``check_routing``).

NOTE: two kinds of fault are found where the work finds them, not here: a name or node
reference that expansion cannot resolve (``expand``, ``system``) and an override path the
file does not have (``overrides``); checking them first would be the same walk twice.
"""
from __future__ import annotations

import math
import re
import os

from ..errors import TopologyError, did_you_mean
from ..route.multipath import POLICIES
from .parse import is_system
from .schema import MAX_NUMBER, TOP, Map, Record, Seq, Value, Variant
from ..size import REF, array_shape, product

#: Engines every PE block must define (the tile-kernel API's model of a PE).
PE_ROLES = ("cp", "sched", "dma_rd", "dma_wr", "gemm", "math", "tcm", "ipcq")
#: The links inside a PE that its engines' data crosses (DMA into and out of the TCM, the
#: GEMM and MATH engines' operands and results), checked at load time.
PE_DATA_LINKS = (("dma_rd", "tcm"), ("tcm", "dma_wr"), ("tcm", "gemm"), ("gemm", "tcm"), ("tcm", "math"), ("math", "tcm"))
DEFAULT_MAX_ELEMENTS = 500_000
ENV_MAX_ELEMENTS = "KBTORCH_MAX_ELEMENTS"
MAX_DEPTH = 32


def validate(doc: dict, path: str, schema=TOP) -> None:
    """Raise TopologyError naming the file and the entry at the first value the schema refuses
    (``schema``: a chip file's ``TOP``, or ``SYSTEM_TOP`` for a system file)."""
    _Checker(path).check(doc, schema, "")


def show(value) -> str:
    """A short description of ``value`` for a message: never a deep or unbounded repr."""
    if isinstance(value, dict):
        return f"a table of {len(value)} keys"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        return f"a list of {len(value)} items"
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {len(str(abs(value)))} digits" if value.bit_length() < 10_000 else "a huge integer"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _hint(value) -> str:
    big = isinstance(value, (int, float)) and not isinstance(value, bool) and MAX_NUMBER < abs(value) < math.inf
    return f" (numbers are limited to {MAX_NUMBER:g} in size)" if big else ""


def _join(where: str, key) -> str:
    return f"{where}.{key}" if where else str(key)


class _Checker:
    def __init__(self, path: str):
        self.path = path

    def fail(self, where: str, message: str):
        raise TopologyError(self.path, where or "top level", message)

    def check(self, value, schema, where: str) -> None:
        if isinstance(schema, Value):
            if not schema.test(value):
                self.fail(where, f"expected {schema.words}, got {show(value)}{_hint(value)}")
        elif isinstance(schema, Record):
            self.record(value, schema.fields, schema, where)
        elif isinstance(schema, Variant):
            self.variant(value, schema, where)
        elif isinstance(schema, Map):
            self.map(value, schema, where)
        else:
            self.seq(value, schema, where)

    def table(self, value, where: str) -> None:
        if not isinstance(value, dict):
            self.fail(where, f"expected a table, got {show(value)}")

    def record(self, value, fields: dict, rules: Record, where: str) -> None:
        self.table(value, where)
        for key in value:
            if key not in fields:
                known = ", ".join(fields) or "none"
                self.fail(_join(where, key), f"unknown key{did_you_mean(key, fields)}; known keys: {known}")
        for key, spec in fields.items():
            if key in value:
                self.check(value[key], spec.schema, _join(where, key))
            elif spec.required:
                self.fail(where, f"missing field '{key}'")
        for group in rules.one_of:
            present = [k for k in group if k in value]
            if len(present) != 1:
                self.fail(where, f"needs exactly one of {', '.join(group)}, got {', '.join(present) or 'none'}")
        for small, big in rules.less:
            if small in value and big in value and not value[small] < value[big]:
                self.fail(_join(where, small), f"must be less than {big} ({value[big]}), got {value[small]}")

    def variant(self, value, schema: Variant, where: str) -> None:
        self.table(value, where)
        if schema.tag not in value:
            self.fail(where, f"missing field '{schema.tag}'")
        tag = value[schema.tag]
        if not isinstance(tag, str) or tag not in schema.kinds:
            known = ", ".join(sorted(schema.kinds))
            self.fail(_join(where, schema.tag),
                      f"unknown {schema.tag} {show(tag)}{did_you_mean(tag, schema.kinds)}; known: {known}")
        rules = schema.kinds[tag]
        self.record(value, {**schema.common, **rules.fields}, rules, where)

    def map(self, value, schema: Map, where: str) -> None:
        self.table(value, where)
        if schema.non_empty and not value:
            self.fail(where, "must not be empty")
        for key, item in value.items():
            if schema.key is not None and not schema.key.test(key):
                self.fail(_join(where, key), f"expected {schema.key.words} as the name, got {show(key)}")
            self.check(item, schema.value, _join(where, key))

    def seq(self, value, schema: Seq, where: str) -> None:
        if not isinstance(value, list):
            self.fail(where, f"expected a list, got {show(value)}")
        for i, item in enumerate(value):
            self.check(item, schema.item, f"{where}[{i}]")


# --- a system and its chip file (before compiling the system) ---

def check_chip(chip: dict, chip_path: str, path: str) -> None:
    """The chip file of system ``path`` is a chip file, not another system."""
    if is_system(chip):
        raise TopologyError(path, "system.chip", f"'{chip_path}' is a system file; a system's chips are chip files")


def check_system_names(doc: dict, path: str, chip_doc: dict, chip_path: str) -> None:
    """No link kind or component of the system has the name of one of its chip file's, and
    no link kind the name of a derived kind (``KIND__xN``: N lanes of KIND, ``system``)."""
    for name in doc["links"]:
        if re.fullmatch(r".+__x\d+", name):
            raise TopologyError(path, f"links.{name}", f"'{name}' is the name of a derived kind (N lanes of a link "
                                "kind are 'KIND__xN'); give the link kind another name")
    for section in ("links", "components"):
        for name in doc[section]:
            if name in chip_doc[section]:
                raise TopologyError(path, f"{section}.{name}", f"'{name}' is also in [{section}] of the chip file "
                                    f"{chip_path}; give the system's another name")


def known(path: str, where: str, name: str, names, what: str, hint: str = "") -> None:
    """Refuse ``name`` at ``where`` unless it is one of ``names`` (a ``what``: link kind, component)."""
    if name not in names:
        raise TopologyError(path, where, f"unknown {what} '{name}'{did_you_mean(name, names)}{hint}")


def check_switch_refs(path: str, switches: dict, links: dict, components: dict) -> None:
    """Every switch tier names a known link kind and component."""
    for name, spec in switches.items():
        known(path, f"switches.{name}.link", spec["link"], links, "link kind")
        known(path, f"switches.{name}.component", spec["component"], components, "component")


def check_ports_used(path: str, groups: dict, used: set) -> None:
    for name in groups:
        if name not in used:
            raise TopologyError(path, f"ports.{name}", "dangling port: the group is joined to nothing (no [tray] "
                                "link names it and no switch tier is over it)")


def check_reach(path: str, trays: int, chips: int, direct: dict, tiers: list) -> None:
    """Every two chips are joined: by a switch tier, else (one tray) by a direct tray link."""
    if tiers:
        return
    if trays > 1:
        raise TopologyError(path, "switches", f"{trays} trays and no switch tier joins them")
    lost = [(i, j) for i in range(chips) for j in range(i + 1, chips) if (i, j) not in direct]
    if lost:
        raise TopologyError(path, "tray.links", f"chips {lost[0][0]} and {lost[0][1]} of a tray are not joined "
                            "(no direct link and no switch tier)")


# --- blocks, nesting and size (before expanding) ---

def check_blocks(doc: dict, path: str, keys=("top", "pe_block")) -> None:
    """The blocks ``[machine]`` names (``top``, ``pe_block``) exist."""
    machine, blocks = doc["machine"], doc["blocks"]
    for key in keys:
        if machine[key] not in blocks:
            raise TopologyError(path, f"machine.{key}", f"unknown block '{machine[key]}'{did_you_mean(machine[key], blocks)}")


def element_limit(path: str, max_elements=None) -> int:
    """``max_elements`` if given, else $KBTORCH_MAX_ELEMENTS, else the default."""
    where = "max_elements"
    if max_elements is None and ENV_MAX_ELEMENTS in os.environ:
        where, max_elements = ENV_MAX_ELEMENTS, os.environ[ENV_MAX_ELEMENTS].strip()
        max_elements = int(max_elements) if max_elements.isascii() and max_elements.isdigit() else max_elements
    if max_elements is None:
        return DEFAULT_MAX_ELEMENTS
    if not isinstance(max_elements, int) or isinstance(max_elements, bool) or max_elements <= 0:
        raise TopologyError(path, where, f"expected a positive integer, got {max_elements!r}")
    return max_elements


def check_size(doc: dict, path: str, limit: int) -> int:
    """The element count (nodes + directed links) of the validated document ``doc``, computed
    from array counts and grids BEFORE expanding; TopologyError above ``limit``. Also checks
    the nesting: every array names a known block, no block contains itself and blocks nest at
    most :data:`MAX_DEPTH` levels (so expanding never recurses deeply)."""
    top = doc["machine"]["top"]
    total, _ = _Counter(doc["blocks"], path).count(top, "machine.top", ())
    if total > limit:
        raise TopologyError(path, "machine.top",
                            f"block '{top}' expands to {total} elements (nodes + directed links), more than "
                            f"the limit of {limit}; raise it with max_elements=N or ${ENV_MAX_ELEMENTS}")
    return total


class _Counter:
    """Counts per block (memoized): a block's elements do not depend on where it is used."""

    def __init__(self, blocks: dict, path: str):
        self.blocks, self.path = blocks, path
        self.memo: dict[str, tuple[int, int]] = {}     # block -> (elements, nesting height)

    def count(self, name: str, where: str, stack: tuple) -> tuple[int, int]:
        if name not in self.blocks:
            raise TopologyError(self.path, where, f"unknown block '{name}'{did_you_mean(name, self.blocks)}")
        if name in stack:
            cycle = " -> ".join(stack[stack.index(name):] + (name,))
            raise TopologyError(self.path, f"blocks.{name}", f"block contains itself ({cycle})")
        if len(stack) >= MAX_DEPTH or len(stack) + self.memo.get(name, (0, 0))[1] > MAX_DEPTH:
            raise TopologyError(self.path, f"blocks.{name}", f"blocks nest deeper than {MAX_DEPTH} levels "
                                f"({' -> '.join(stack[:3])} -> ... -> {name})")
        if name not in self.memo:
            self.memo[name] = self.measure(name, stack + (name,))
        return self.memo[name]

    def measure(self, name: str, stack: tuple) -> tuple[int, int]:
        spec = self.blocks[name]
        total, height = len(spec.get("nodes", {})), 1
        for arr_name, arr in spec.get("arrays", {}).items():
            shape = array_shape(arr)
            inner, below = self.count(arr["block"], f"blocks.{name}.arrays.{arr_name}.block", stack)
            total += product(shape) * inner
            height = max(height, below + 1)
            dims = arr.get("dims", [arr_name] if len(shape) == 1 else [])
            for rule in arr.get("connect", []):
                if rule["dim"] in dims and len(dims) == len(shape):
                    n = shape[dims.index(rule["dim"])]
                    total += 2 * (product(shape) // n) * (n - 1 + (rule.get("wrap", False) and n > 1))
        for link in spec.get("links", []):
            b = link["b"] if isinstance(link["b"], list) else [link["b"]]
            pairs = max(self.ref_count(link["a"], spec), sum(self.ref_count(r, spec) for r in b))
            total += pairs * (2 if link.get("dir", "both") == "both" else 1)
        return total, height

    def ref_count(self, ref: str, spec: dict) -> int:
        """How many nodes a reference like ``cube[*].pe[*].tcm`` names (1 if malformed: the
        expander reports it)."""
        count, cur = 1, spec
        for part in ref.split("."):
            m = REF.match(part)
            arr = cur.get("arrays", {}).get(m.group(1)) if m and m.group(2) is not None else None
            if arr is None:
                return count
            if m.group(2) == "*":
                count *= product(array_shape(arr))
            cur = self.blocks.get(arr["block"], {})
        return count


# --- the expanded machine and its graph ---

def check_pes(raw) -> None:
    """The PE block is instantiated at least once."""
    if not raw.pes:
        raise TopologyError(raw.path, "machine.pe_block", f"block '{raw.machine['pe_block']}' is never instantiated")


def check_graph(graph, path: str) -> None:
    """Only a node that forwards traffic (``transit``) replicates it (``multicast``)."""
    for name, d in graph.nodes(data=True):
        if d["params"].get("multicast") and not d["transit"]:
            raise TopologyError(path, f"components ({name})",
                                "multicast = true needs transit = true: only a node that forwards traffic "
                                "replicates it")


def check_roles(nodes: dict, names: dict, path: str) -> None:
    """Each role ``pe_roles`` (``[machine]``) names is a node of the PE block."""
    for role, local in names.items():
        if local not in nodes:
            raise TopologyError(path, f"machine.pe_roles.{role}", f"names '{local}', which is not a node of the PE "
                                f"block (its nodes: {', '.join(sorted(nodes))})")


def check_engines(pes, graph, pe_block: str, path: str) -> None:
    """Every PE has the engines of ``PE_ROLES`` and the links of ``PE_DATA_LINKS``."""
    for pe in pes:
        missing = [r for r in PE_ROLES if r not in pe.roles]
        if missing:
            raise TopologyError(path, f"blocks.{pe_block}", f"PE {pe.id} lacks engines {missing}")
        lost = [f"{a} -> {b}" for a, b in PE_DATA_LINKS if not graph.has_edge(pe.node(a), pe.node(b))]
        if lost:
            raise TopologyError(path, f"blocks.{pe_block}.links", f"PE {pe.id} has no link "
                                f"{', '.join(lost)}: its engines move data to and from its TCM over them")


def check_dims(graph, route_order: list, reset: list, path: str) -> None:
    """``route_order`` and ``route_reset`` name dimensions that label links."""
    dims = {d["dim"] for _, _, d in graph.edges(data=True) if d["dim"] is not None}
    unknown = sorted((set(route_order) | set(reset)) - dims)
    if unknown:
        raise TopologyError(path, "machine.route_order", f"dimensions {unknown} label no link (have {sorted(dims)})")
    stray = sorted(set(reset) - set(route_order))
    if stray:
        raise TopologyError(path, "machine.route_reset", f"dimensions {stray} are not in route_order")


def check_chip_levels(chip, levels, path: str, chip_path: str) -> None:
    """A system's chip has none of the dimensions (``levels``) the system adds above it."""
    clash = sorted(set(chip.pes[0].coords) & set(levels))
    if clash:
        raise TopologyError(path, "system.chip", f"the chip file {chip_path} has its own dimension "
                            f"{clash[0]!r}; a system adds {', '.join(levels)} above the chip")


def check_routable(machine) -> None:
    """Every PE reaches every other PE and its own memories; fail at load time if not."""
    # NOTE: the same checks as one search per PE, answered from one reachability pass
    # (routing.Reach); Router.route runs only to report a memory that is unroutable.
    g = machine.graph
    ports = [(pe.node("dma_wr"), pe.node("dma_rd")) for pe in machine.pes]
    entries = list(dict.fromkeys(_port(machine, rd, "in") for _, rd in ports))
    ends = [r for pe in machine.pes for n in (pe.node("dma_rd"), pe.hbm) if n for r in g.predecessors(n)
            if g.nodes[r]["transit"]]
    reach = machine.router.reach(entries + ends)
    need = reach.mask(entries)
    for wr, _ in ports:
        got = reach.from_node(_port(machine, wr, "out"))
        if got & need != need:
            lost = next(e for e in entries if not got & reach.bit[e])
            raise TopologyError(machine.path, "route", f"PE {g.nodes[wr]['pe']} ('{wr}') cannot reach '{lost}'")
    for pe in machine.pes:
        for src, dst in ((pe.hbm, pe.node("dma_rd")), (pe.node("dma_wr"), pe.hbm)):
            if pe.hbm and not reach.routable(src, dst):
                machine.route(src, dst)


def _port(machine, node: str, way: str) -> str:
    """The first transit node after (``out``) or before (``in``) an endpoint."""
    g = machine.graph
    near = g.successors(node) if way == "out" else g.predecessors(node)
    transit = [r for r in near if g.nodes[r]["transit"]]
    if not transit:
        raise TopologyError(machine.path, "route", f"'{node}' (PE {g.nodes[node].get('pe')}) is disconnected: no link {'to' if way == 'out' else 'from'} the network")
    return transit[0]


def check_routing(doc: dict | None, graph, path: str, system: bool = False) -> None:
    """The ``[routing]`` section: a known policy, with what it needs, and no field the policy
    or the machine would ignore."""
    doc = doc or {}
    policy = doc.get("policy", "single")
    if policy not in POLICIES:
        raise TopologyError(path, "routing.policy", f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
    kind = doc.get("port_kind")
    if policy == "port-spray" and kind is None:
        raise TopologyError(path, "routing.port_kind", "policy 'port-spray' needs port_kind (the component "
                            "kind of a chip's network ports, e.g. \"nic\")")
    if kind is not None:
        nodes = [n for n, d in graph.nodes(data=True) if d["kind"] == kind]
        if not nodes:
            raise TopologyError(path, "routing.port_kind", f"no node is of kind {kind!r}")
        stop = next((n for n in nodes if not graph.nodes[n]["transit"]), None)
        if stop is not None:
            raise TopologyError(path, "routing.port_kind", f"{kind!r} is not a network port: no route passes "
                                f"through its nodes ('{stop}' has transit = false)")
    if doc.get("adaptive") and policy == "single":
        raise TopologyError(path, "routing.adaptive", "adaptive spraying needs a spraying policy "
                            "('minimal-spray' or 'port-spray'), not 'single'")
    relays = doc.get("relays", 0)
    if relays > 1:
        raise TopologyError(path, "routing.relays", f"{relays}: a way between two chips crosses at most one "
                            "other chip (0 or 1)")
    if relays and not system:
        raise TopologyError(path, "routing.relays", f"{relays}: relay chips exist only on a system of chips; "
                            "this machine is one chip (0)")
    if relays and policy == "single":
        raise TopologyError(path, "routing.relays", f"{relays}: a way through a relay chip needs a spraying "
                            "policy ('minimal-spray' or 'port-spray'); 'single' takes the one route (0)")
