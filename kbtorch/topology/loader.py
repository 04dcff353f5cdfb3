"""Topology files (TOML, data only) -> flat lists of nodes and directed links.

A file has six sections (see docs/topology-format.md): ``[machine]``, ``[issue]``,
``[links]`` (link kinds: ``bw_gbps``, ``prop_ns``), ``[components]`` (component types:
``kind``, ``overhead_ns``, ``transit`` and free parameters), and ``[blocks.NAME]``: a block
holds named nodes, arrays of nested blocks (``count`` or ``grid`` + ``connect`` rules that
join neighbours along a dimension, with ``wrap`` for rings and tori), links between its
nodes, and ``bind`` entries that give array elements an attribute (a PE's HBM slice).

The loader knows no hierarchy names: SIP, CUBE and PE exist only in the files. Every error
is a :class:`TopologyError` naming the file and the entry at fault.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TopologyError

_REF = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\[(\*|\d+)\])?$")
_DIRS = ("both", "a->b", "b->a")


@dataclass
class RawTopology:
    """The expanded, validated contents of a topology file (before graph compilation)."""

    path: str
    machine: dict
    issue: dict
    links: dict
    nodes: dict = field(default_factory=dict)      # full name -> attribute dict
    edges: dict = field(default_factory=dict)      # (src, dst) -> attribute dict
    pes: list = field(default_factory=list)        # PE id -> {"prefix", "roles", "coords", binds}


def _need(table: dict, key: str, types, where: str, path: str):
    if key not in table:
        raise TopologyError(path, where, f"missing field '{key}'")
    value = table[key]
    types = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = " or ".join(t.__name__ for t in types)
        raise TopologyError(path, f"{where}.{key}", f"expected {names}, got {value!r}")
    return value


def read_toml(path: str | Path) -> dict:
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise TopologyError(str(path), "file", "no such topology file") from None
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(str(path), "file", f"not valid TOML: {exc}") from None


def load_raw(path: str | Path) -> RawTopology:
    """Read and expand a topology file into nodes and edges; raise TopologyError on bad input."""
    path = str(path)
    doc = read_toml(path)
    machine = _need(doc, "machine", dict, "top level", path)
    for key, types in (("name", str), ("flit_bytes", int), ("clock_ghz", (int, float)),
                       ("top", str), ("pe_block", str), ("route_order", list)):
        _need(machine, key, types, "machine", path)
    if machine["flit_bytes"] <= 0 or machine["clock_ghz"] <= 0:
        raise TopologyError(path, "machine", "flit_bytes and clock_ghz must be positive")
    for key in ("route_order", "route_reset"):
        dims = machine.get(key, [])
        if not isinstance(dims, list) or not all(isinstance(d, str) for d in dims):
            raise TopologyError(path, f"machine.{key}", f"expected a list of dimension names, got {dims!r}")
    issue = _need(doc, "issue", dict, "top level", path)
    for key in ("fixed_cycles", "per_byte_cycles", "composite_cap_bytes"):
        if _need(issue, key, (int, float), "issue", path) < 0:
            raise TopologyError(path, f"issue.{key}", "must not be negative")
    links = _check_links(_need(doc, "links", dict, "top level", path), path)
    comps = _check_components(_need(doc, "components", dict, "top level", path), path)
    blocks = _need(doc, "blocks", dict, "top level", path)
    raw = RawTopology(path=path, machine=machine, issue=issue, links=links)
    _Expander(raw, comps, blocks).run()
    if not raw.pes:
        raise TopologyError(path, "machine.pe_block", f"block '{machine['pe_block']}' is never instantiated")
    return raw


def _check_links(links: dict, path: str) -> dict:
    for name, spec in links.items():
        where = f"links.{name}"
        if not isinstance(spec, dict):
            raise TopologyError(path, where, "expected a table")
        _need(spec, "kind", str, where, path)
        if _need(spec, "bw_gbps", (int, float), where, path) <= 0:
            raise TopologyError(path, f"{where}.bw_gbps", f"bandwidth must be positive, got {spec['bw_gbps']}")
        if _need(spec, "prop_ns", (int, float), where, path) < 0:
            raise TopologyError(path, f"{where}.prop_ns", f"propagation must not be negative, got {spec['prop_ns']}")
    return links


def _check_components(comps: dict, path: str) -> dict:
    for name, spec in comps.items():
        where = f"components.{name}"
        if not isinstance(spec, dict):
            raise TopologyError(path, where, "expected a table")
        _need(spec, "kind", str, where, path)
        overhead = spec.get("overhead_ns", 0)
        if not isinstance(overhead, (int, float)) or isinstance(overhead, bool) or overhead < 0:
            raise TopologyError(path, f"{where}.overhead_ns", f"must be a non-negative number, got {overhead!r}")
        if "transit" in spec and not isinstance(spec["transit"], bool):
            raise TopologyError(path, f"{where}.transit", "expected true or false")
        for key in ("channels", "channel_gbps", "burst_bytes"):
            if key in spec and (not isinstance(spec[key], (int, float)) or spec[key] <= 0):
                raise TopologyError(path, f"{where}.{key}", f"must be positive, got {spec[key]!r}")
        tflops = spec.get("tflops", {})
        if not isinstance(tflops, dict) or not all(isinstance(v, (int, float)) and v >= 0 for v in tflops.values()):
            raise TopologyError(path, f"{where}.tflops", f"expected a table of non-negative numbers, got {tflops!r}")
    return comps


class _Expander:
    """Instantiates blocks recursively; names are dotted paths like ``sip0.cube5.pe3.tcm``."""

    def __init__(self, raw: RawTopology, comps: dict, blocks: dict):
        self.raw, self.comps, self.blocks, self.path = raw, comps, blocks, raw.path
        self.binds: dict[str, dict] = {}   # element prefix -> {attr: node}
        self.pe_prefixes: list[tuple[str, dict]] = []

    def run(self) -> None:
        top = self.raw.machine["top"]
        if top not in self.blocks:
            raise TopologyError(self.path, "machine.top", f"unknown block '{top}'")
        if self.raw.machine["pe_block"] not in self.blocks:
            raise TopologyError(self.path, "machine.pe_block", f"unknown block '{self.raw.machine['pe_block']}'")
        self.block(top, "", {}, ())
        for pe, (prefix, coords) in enumerate(self.pe_prefixes):
            roles = {n[len(prefix):]: n for n in self.raw.nodes if n.startswith(prefix) and "." not in n[len(prefix):]}
            for name in roles.values():
                self.raw.nodes[name]["pe"] = pe
            self.raw.pes.append({"prefix": prefix, "coords": coords, "roles": roles, **self.binds.get(prefix, {})})

    def block(self, name: str, prefix: str, coords: dict, stack: tuple) -> None:
        if name in stack:
            raise TopologyError(self.path, f"blocks.{name}", "block contains itself")
        spec = self.blocks.get(name)
        if not isinstance(spec, dict):
            raise TopologyError(self.path, f"blocks.{name}", "unknown or malformed block")
        if name == self.raw.machine["pe_block"]:
            self.pe_prefixes.append((prefix, dict(coords)))
        where = f"blocks.{name}"
        for key, types in (("nodes", dict), ("arrays", dict), ("links", list), ("bind", list)):
            if not isinstance(spec.get(key, types()), types):
                raise TopologyError(self.path, f"{where}.{key}", f"expected a {'table' if types is dict else 'list'}")
        for local, comp in spec.get("nodes", {}).items():
            if comp not in self.comps:
                raise TopologyError(self.path, f"{where}.nodes.{local}", f"unknown component '{comp}'")
            self.node(prefix + local, local, comp, coords)
        for arr_name, arr in spec.get("arrays", {}).items():
            self.array(where, arr_name, arr, prefix, coords, stack + (name,))
        for i, link in enumerate(spec.get("links", [])):
            self.block_link(f"{where}.links[{i}]", link, prefix, spec)
        for i, bind in enumerate(spec.get("bind", [])):
            self.bind(f"{where}.bind[{i}]", bind, prefix, spec)

    def node(self, full: str, local: str, comp: str, coords: dict) -> None:
        spec = self.comps[comp]
        params = {k: v for k, v in spec.items() if k not in ("kind", "overhead_ns", "transit")}
        self.raw.nodes[full] = {
            "kind": spec["kind"], "component": comp, "role": local,
            "overhead_ns": spec.get("overhead_ns", 0), "transit": spec.get("transit", False),
            "coords": dict(coords), "params": params,
        }

    def array(self, where: str, arr_name: str, arr: dict, prefix: str, coords: dict, stack: tuple) -> None:
        w = f"{where}.arrays.{arr_name}"
        if not isinstance(arr, dict):
            raise TopologyError(self.path, w, "expected a table")
        block = _need(arr, "block", str, w, self.path)
        shape = arr.get("grid", [arr.get("count")])
        bad = any(not isinstance(s, int) or isinstance(s, bool) or s <= 0 for s in shape) if isinstance(shape, list) else True
        if bad or not shape:
            raise TopologyError(self.path, w, f"needs a positive 'count' or 'grid', got {shape!r}")
        dims = arr.get("dims", [arr_name] if len(shape) == 1 else None)
        if not isinstance(dims, list) or len(dims) != len(shape):
            raise TopologyError(self.path, f"{w}.dims", f"needs one name per grid dimension ({len(shape)})")
        total = 1
        for s in shape:
            total *= s
        for i in range(total):
            idx = _unflatten(i, shape)
            sub = dict(coords)
            sub.update(zip(dims, idx))
            self.block(block, f"{prefix}{arr_name}{i}.", sub, stack)
        for j, rule in enumerate(arr.get("connect", [])):
            self.connect(f"{w}.connect[{j}]", rule, prefix + arr_name, shape, dims)

    def connect(self, where: str, rule: dict, base: str, shape: list, dims: list) -> None:
        dim = _need(rule, "dim", str, where, self.path)
        if dim not in dims:
            raise TopologyError(self.path, f"{where}.dim", f"'{dim}' is not one of {dims}")
        axis = dims.index(dim)
        a, b = _need(rule, "a", str, where, self.path), _need(rule, "b", str, where, self.path)
        link = self.link_kind(where, rule)
        wrap = rule.get("wrap", False)
        total = 1
        for s in shape:
            total *= s
        for i in range(total):
            idx = list(_unflatten(i, shape))
            if idx[axis] + 1 < shape[axis]:
                idx[axis] += 1
            elif wrap and shape[axis] > 1:
                idx[axis] = 0
            else:
                continue
            j = _flatten(idx, shape)
            if j == i:
                continue
            src = self.existing(where, f"{base}{i}.{a}")
            dst = self.existing(where, f"{base}{j}.{b}")
            self.edge(where, src, dst, link, "both", dim)

    def link_kind(self, where: str, rule: dict) -> str:
        link = _need(rule, "link", str, where, self.path)
        if link not in self.raw.links:
            raise TopologyError(self.path, f"{where}.link", f"unknown link kind '{link}'")
        return link

    def existing(self, where: str, full: str) -> str:
        if full not in self.raw.nodes:
            raise TopologyError(self.path, where, f"unknown node '{full}'")
        return full

    def resolve(self, where: str, ref: str, prefix: str, spec: dict) -> list[str]:
        """A reference like ``r0``, ``pe[3].tcm`` or ``pe[*].dma_rd`` -> full node names."""
        if not isinstance(ref, str) or not ref:
            raise TopologyError(self.path, where, f"bad node reference {ref!r}")
        names, cur = [prefix], spec
        for part in ref.split("."):
            m = _REF.match(part)
            if not m:
                raise TopologyError(self.path, where, f"bad node reference '{ref}'")
            token, index = m.groups()
            if index is None:
                names = [n + token + "." for n in names]
            elif index == "*":
                count = self.array_size(where, cur, token, ref)
                names = [n + f"{token}{i}." for n in names for i in range(count)]
            else:
                names = [n + f"{token}{index}." for n in names]
            arr = cur.get("arrays", {}).get(token) if index is not None else None
            cur = self.blocks.get(arr["block"], {}) if arr else {}
        out = []
        for name in names:
            if name[:-1] not in self.raw.nodes:
                raise TopologyError(self.path, where, f"unknown node reference '{ref}' (no node '{name[:-1]}')")
            out.append(name[:-1])
        return out

    def array_size(self, where: str, spec: dict, token: str, ref: str) -> int:
        arr = spec.get("arrays", {}).get(token)
        if arr is None:
            raise TopologyError(self.path, where, f"'{ref}': '{token}' is not an array of the block it is used in")
        total = 1
        for s in arr.get("grid", [arr.get("count", 0)]):
            total *= s
        return total

    def block_link(self, where: str, link: dict, prefix: str, spec: dict) -> None:
        if not isinstance(link, dict):
            raise TopologyError(self.path, where, "expected a table")
        kind = self.link_kind(where, link)
        direction = link.get("dir", "both")
        if direction not in _DIRS:
            raise TopologyError(self.path, f"{where}.dir", f"expected one of {_DIRS}, got {direction!r}")
        srcs = self.resolve(where, _need(link, "a", str, where, self.path), prefix, spec)
        b = _need(link, "b", (str, list), where, self.path)
        dsts = [d for ref in ([b] if isinstance(b, str) else b) for d in self.resolve(where, ref, prefix, spec)]
        if len(dsts) == 1:
            dsts = dsts * len(srcs)
        if len(srcs) == 1:
            srcs = srcs * len(dsts)
        if len(srcs) != len(dsts):
            raise TopologyError(self.path, where, f"'a' names {len(srcs)} nodes but 'b' names {len(dsts)}")
        for u, v in zip(srcs, dsts):
            self.edge(where, u, v, kind, direction, None)

    def edge(self, where: str, a: str, b: str, link: str, direction: str, dim) -> None:
        pairs = {"both": [(a, b), (b, a)], "a->b": [(a, b)], "b->a": [(b, a)]}[direction]
        spec = self.raw.links[link]
        for u, v in pairs:
            if u == v:
                raise TopologyError(self.path, where, f"link from '{u}' to itself")
            if (u, v) in self.raw.edges:
                raise TopologyError(self.path, where, f"duplicate link '{u}' -> '{v}'")
            self.raw.edges[(u, v)] = {"link": link, "kind": spec["kind"], "bw_gbps": float(spec["bw_gbps"]),
                                      "prop_ns": float(spec["prop_ns"]), "dim": dim}

    def bind(self, where: str, bind: dict, prefix: str, spec: dict) -> None:
        array = _need(bind, "array", str, where, self.path)
        attr = _need(bind, "attr", str, where, self.path)
        count = self.array_size(where, spec, array, array)
        nodes = _need(bind, "nodes", (str, list), where, self.path)
        nodes = [nodes] * count if isinstance(nodes, str) else nodes
        if len(nodes) != count:
            raise TopologyError(self.path, f"{where}.nodes", f"array '{array}' has {count} elements, got {len(nodes)} nodes")
        for i, ref in enumerate(nodes):
            found = self.resolve(where, ref, prefix, spec)
            if len(found) != 1:
                raise TopologyError(self.path, f"{where}.nodes", f"'{ref}' names {len(found)} nodes, expected one")
            (full,) = found
            self.binds.setdefault(f"{prefix}{array}{i}.", {})[attr] = full


def _unflatten(i: int, shape: list) -> tuple:
    idx = []
    for s in reversed(shape):
        idx.append(i % s)
        i //= s
    return tuple(reversed(idx))


def _flatten(idx: list, shape: list) -> int:
    i = 0
    for x, s in zip(idx, shape):
        i = i * s + x
    return i
