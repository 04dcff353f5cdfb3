"""Expands the blocks of a validated topology document into flat nodes and directed links.

Runs after the schema and the size and nesting check (validate.py): every value
has its type, every array names a known block and the nesting is shallow, so what remains
to check here are names: components, link kinds, node references and unique node names.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import TopologyError, did_you_mean
from ..size import REF, array_shape, product


@dataclass
class RawTopology:
    """The expanded, validated contents of a topology file (before graph compilation)."""

    path: str
    machine: dict
    issue: dict
    links: dict
    launch: dict | None = None
    routing: dict | None = None
    system: object = None                          # a system file's SystemLayout (topology.system)
    nodes: dict = field(default_factory=dict)      # full name -> attribute dict
    edges: dict = field(default_factory=dict)      # (src, dst) -> attribute dict
    pes: list = field(default_factory=list)        # PE id -> {"prefix", "roles", "coords", binds}


class Expander:
    """Instantiates blocks recursively; names are dotted paths like ``sip0.cube5.pe3.tcm``."""

    def __init__(self, raw: RawTopology, comps: dict, blocks: dict):
        self.raw, self.comps, self.blocks, self.path = raw, comps, blocks, raw.path
        self.binds: dict[str, dict] = {}   # element prefix -> {attr: node}
        self.pe_prefixes: list[tuple[str, dict, list]] = []
        self.origin: dict[str, str] = {}   # full node name -> the block instance that made it

    def run(self) -> None:
        top = self.raw.machine["top"]
        self.block(top, "", {}, f"blocks.{top}")
        for pe, (prefix, coords, local) in enumerate(self.pe_prefixes):
            # NOTE: a PE's roles are the nodes of its own block instance (names are unique,
            # so no other node has this prefix without a further dot); no scan of all nodes.
            roles = {name: prefix + name for name in local}
            for name in roles.values():
                self.raw.nodes[name]["pe"] = pe
            self.raw.pes.append({"prefix": prefix, "coords": coords, "roles": roles, **self.binds.get(prefix, {})})

    def block(self, name: str, prefix: str, coords: dict, origin: str) -> None:
        spec = self.blocks[name]
        where = f"blocks.{name}"
        if name == self.raw.machine["pe_block"]:
            self.pe_prefixes.append((prefix, dict(coords), list(spec.get("nodes", {}))))
        for local, comp in spec.get("nodes", {}).items():
            if comp not in self.comps:
                raise TopologyError(self.path, f"{where}.nodes.{local}", f"unknown component '{comp}'{did_you_mean(comp, self.comps)}")
            self.node(prefix + local, local, comp, coords, origin)
        for arr_name, arr in spec.get("arrays", {}).items():
            self.array(f"{where}.arrays.{arr_name}", arr_name, arr, prefix, coords)
        for i, link in enumerate(spec.get("links", [])):
            self.block_link(f"{where}.links[{i}]", link, prefix, spec)
        for i, bind in enumerate(spec.get("bind", [])):
            self.bind(f"{where}.bind[{i}]", bind, prefix, spec)

    def node(self, full: str, local: str, comp: str, coords: dict, origin: str) -> None:
        if full in self.raw.nodes:
            raise TopologyError(self.path, origin, f"node name '{full}' is already used by {self.origin[full]}; "
                                "rename one of the arrays or nodes")
        self.origin[full] = origin
        spec = self.comps[comp]
        params = {k: v for k, v in spec.items() if k not in ("kind", "overhead_ns", "transit")}
        self.raw.nodes[full] = {
            "kind": spec["kind"], "component": comp, "role": local,
            "overhead_ns": spec.get("overhead_ns", 0), "transit": spec.get("transit", False),
            "coords": dict(coords), "params": params,
        }

    def array(self, w: str, arr_name: str, arr: dict, prefix: str, coords: dict) -> None:
        shape = array_shape(arr)
        dims = arr.get("dims", [arr_name] if len(shape) == 1 else None)
        if dims is None or len(dims) != len(shape):
            raise TopologyError(self.path, f"{w}.dims", f"needs one name per grid dimension ({len(shape)})")
        for i in range(product(shape)):
            sub = dict(coords)
            sub.update(zip(dims, _unflatten(i, shape)))
            self.block(arr["block"], f"{prefix}{arr_name}{i}.", sub, f"{w}[{i}]")
        for j, rule in enumerate(arr.get("connect", [])):
            self.connect(f"{w}.connect[{j}]", rule, prefix + arr_name, shape, dims)

    def connect(self, where: str, rule: dict, base: str, shape: list, dims: list) -> None:
        dim, a, b = rule["dim"], rule["a"], rule["b"]
        if dim not in dims:
            raise TopologyError(self.path, f"{where}.dim", f"'{dim}' is not one of {dims}")
        axis = dims.index(dim)
        link = self.link_kind(where, rule)
        wrap = rule.get("wrap", False)
        for i in range(product(shape)):
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
        link = rule["link"]
        if link not in self.raw.links:
            raise TopologyError(self.path, f"{where}.link", f"unknown link kind '{link}'{did_you_mean(link, self.raw.links)}")
        return link

    def existing(self, where: str, full: str) -> str:
        if full not in self.raw.nodes:
            raise TopologyError(self.path, where, f"unknown node '{full}'")
        return full

    def resolve(self, where: str, ref: str, prefix: str, spec: dict) -> list[str]:
        """A reference like ``r0``, ``pe[3].tcm`` or ``pe[*].dma_rd`` -> full node names."""
        if not ref:
            raise TopologyError(self.path, where, f"bad node reference {ref!r}")
        names, cur = [prefix], spec
        for part in ref.split("."):
            m = REF.match(part)
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
        return product(array_shape(arr))

    def block_link(self, where: str, link: dict, prefix: str, spec: dict) -> None:
        kind = self.link_kind(where, link)
        direction = link.get("dir", "both")
        srcs = self.resolve(where, link["a"], prefix, spec)
        b = link["b"]
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
        array, attr = bind["array"], bind["attr"]
        elements = self.elements(where, array, prefix, spec)
        nodes = bind["nodes"]
        nodes = [nodes] * len(elements) if isinstance(nodes, str) else nodes
        if len(nodes) != len(elements):
            raise TopologyError(self.path, f"{where}.nodes", f"array '{array}' has {len(elements)} elements, "
                                f"got {len(nodes)} nodes")
        for element, ref in zip(elements, nodes):
            found = self.resolve(where, ref, prefix, spec)
            if len(found) != 1:
                raise TopologyError(self.path, f"{where}.nodes", f"'{ref}' names {len(found)} nodes, expected one")
            (full,) = found
            self.binds.setdefault(element, {})[attr] = full

    def elements(self, where: str, array: str, prefix: str, spec: dict) -> list[str]:
        """Name prefixes of the elements of ``array``: an array of this block (``pe``) or,
        through arrays of nested blocks, of an inner one (``cluster[*].tile``, ``cluster[2].tile``).

        NOTE: the nested form lets a memory of an outer block (a die-wide HBM) be bound to
        the PEs of inner arrays; only the last part names the array whose elements get it."""
        *outer, last = array.split(".")
        prefixes, cur = [prefix], spec
        for part in outer:
            m = REF.match(part)
            if not m or m.group(2) is None:
                raise TopologyError(self.path, f"{where}.array", f"'{array}': '{part}' must be ARRAY[*] or ARRAY[i]")
            token, index = m.groups()
            count = self.array_size(where, cur, token, array)
            picks = range(count) if index == "*" else [int(index)]
            if picks[-1] >= count:
                raise TopologyError(self.path, f"{where}.array", f"'{array}': '{token}' has elements 0..{count - 1}")
            prefixes = [f"{p}{token}{i}." for p in prefixes for i in picks]
            cur = self.blocks[cur["arrays"][token]["block"]]
        count = self.array_size(where, cur, last, array)
        return [f"{p}{last}{i}." for p in prefixes for i in range(count)]


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
