"""System files: a chip file instantiated once per chip, the chips joined by trays and switch tiers.

A system file (docs/topology-format.md, "System files") names a chip file, how many trays
of how many chips, the chip's network ports as named port groups (``[ports]``: ``lanes``
ports on a node of the chip, e.g. Maia's 28 ANCs as four groups), the links between port
groups of the chips of a tray (``[tray]``), and switch tiers (``[switches.NAME]``: one
switch per ``per`` trays over a port group, or per ``per`` switches of the tier below).

``compile_system`` writes it as a chip-style document (blocks ``__chip``: the
chip's top block plus its port nodes, ``__tray``, ``__system``) that the ordinary expander
turns into one flat machine: PEs chip-major (``tray0.chip0.`` first), the chip a level of
the PE names (``--group chip:3``), each chip's own launch node. ``SystemLayout`` keeps the
structure the system router (``route/system.py``) routes over: chip-local routes come from
the chip alone, routes between chips go port group to port group, directly or up the tiers.

NOTE: the checks of a system are ``validate``'s (names, references, dangling ports, reach);
those of a port group, a tray link and the tiers (``_group``, ``_member``, ``_tray``,
``_tiers``) are made here, as the structure they check is built: checking first would be
the same walk twice.

NOTE: a port group is one port node whose link to ``attach`` and to its peers carries
``lanes`` x the lane's bandwidth (``split = false``, the default): single-path routing then
uses all of a group's lanes. ``split = true`` makes ``lanes`` port nodes ``NAME0..``, each
with its own links (for a per-packet path policy that sprays over them).
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass

from .errors import TopologyError, did_you_mean
from .load.validate import check_ports_used, check_reach, check_switch_refs, check_system_names, known

#: The coordinates (and PE-name levels) a system adds above the chip's own.
LEVELS = ("tray", "chip")
_MEMBER = re.compile(r"^chip(\d+)\.([A-Za-z_][A-Za-z0-9_]*)$")


@dataclass(frozen=True)
class PortGroup:
    """``lanes`` ports named ``name`` (or ``name0..`` when ``split``) on chip node ``attach``."""

    name: str
    attach: str
    lanes: int
    split: bool

    @property
    def nodes(self) -> tuple:
        return tuple(f"{self.name}{i}" for i in range(self.lanes)) if self.split else (self.name,)


@dataclass(frozen=True)
class Tier:
    """``count`` switches ``NAME_i``; switch ``i`` is over trays (or lower switches) ``i*per..``."""

    name: str
    down: str
    per: int
    count: int


@dataclass(frozen=True)
class SystemLayout:
    """The structure of a system: chips (name prefixes, chip-major), port groups, the direct
    links inside a tray (``direct[(i, j)]``: the port groups joining local chips i and j)
    and the switch tiers bottom-up (``tiers[0]`` is over port group ``tiers[0].down``)."""

    chip_path: str
    chip_overrides: dict
    trays: int
    per_tray: int
    groups: dict
    direct: dict
    tiers: tuple

    @property
    def chips(self) -> int:
        return self.trays * self.per_tray

    def prefix(self, chip: int) -> str:
        return f"tray{chip // self.per_tray}.chip{chip % self.per_tray}."

    def chip_of(self, node: str) -> int | None:
        """The chip a node belongs to (None for a switch)."""
        if not node.startswith("tray"):
            return None
        tray, _, rest = node[4:].partition(".chip")
        return int(tray) * self.per_tray + int(rest.partition(".")[0])

    def switches(self, chip: int) -> tuple:
        """The switches above ``chip``, bottom-up (one per tier)."""
        out, i = [], chip // self.per_tray
        for tier in self.tiers:
            i //= tier.per
            out.append(f"{tier.name}_{i}")
        return tuple(out)


def compile_system(doc: dict, path: str, chip_doc: dict, chip_path: str) -> tuple[dict, SystemLayout]:
    """The chip-style document of system ``doc`` (validated) over chip ``chip_doc`` (validated),
    and its ``SystemLayout``; TopologyError naming the system file and the field at fault."""
    sysd, ports, tray = doc["system"], doc["ports"], doc["tray"]
    check_system_names(doc, path, chip_doc, chip_path)
    top = chip_doc["blocks"][chip_doc["machine"]["top"]]
    groups = {name: _group(path, name, spec, top, doc) for name, spec in ports.items()}
    links = {**chip_doc["links"], **doc["links"]}
    chip_block = copy.deepcopy(top)
    nodes = chip_block.setdefault("nodes", {})
    extra = chip_block.setdefault("links", [])
    for name, g in groups.items():
        spec = ports[name]
        kind = _lanes_link(links, spec["link"], 1 if g.split else g.lanes)
        for node in g.nodes:
            nodes[node] = spec["component"]
            extra.append({"a": node, "b": g.attach, "link": kind})
    direct, tray_links = _tray(path, tray, groups, links)
    check_switch_refs(path, doc.get("switches", {}), links, {**chip_doc["components"], **doc["components"]})
    tiers = _tiers(path, doc.get("switches", {}), groups, sysd["trays"])
    used = {g for pair in direct.values() for g in pair} | {t.down for t in tiers}
    check_ports_used(path, groups, used)
    check_reach(path, sysd["trays"], tray["chips"], direct, tiers)
    system_block = {"arrays": {"tray": {"block": "__tray", "count": sysd["trays"]}},
                    "nodes": {f"{t.name}_{i}": doc["switches"][t.name]["component"] for t in tiers for i in range(t.count)},
                    "links": _switch_links(doc.get("switches", {}), tiers, groups, links, sysd["trays"], tray["chips"])}
    machine = dict(chip_doc["machine"], name=sysd["name"], top="__system")
    machine["description"] = sysd.get("description", f"{sysd['name']}: {sysd['trays']} x {tray['chips']} chips")
    out = {"machine": machine, "issue": chip_doc["issue"], "links": links,
           "components": {**chip_doc["components"], **doc["components"]},
           "blocks": {**chip_doc["blocks"], "__chip": chip_block,
                      "__tray": {"arrays": {"chip": {"block": "__chip", "count": tray["chips"]}}, "links": tray_links},
                      "__system": system_block}}
    if "launch" in chip_doc:
        out["launch"] = chip_doc["launch"]
    # NOTE: the system's own [routing] (its port groups are the paths to spray over), else the chip's.
    if "routing" in doc or "routing" in chip_doc:
        out["routing"] = doc.get("routing", chip_doc.get("routing"))
    layout = SystemLayout(chip_path, dict(sysd.get("chip_overrides", {})), sysd["trays"], tray["chips"], groups, direct,
                    tuple(tiers))
    return out, layout


def _group(path: str, name: str, spec: dict, top: dict, doc: dict) -> PortGroup:
    where = f"ports.{name}"
    if spec["attach"] not in top.get("nodes", {}):
        raise TopologyError(path, f"{where}.attach", f"no node '{spec['attach']}' in the chip's top block (its nodes: "
                            f"{', '.join(sorted(top.get('nodes', {})))})")
    known(path, f"{where}.component", spec["component"], doc["components"], "component",
           " (ports use the system's [components])")
    known(path, f"{where}.link", spec["link"], doc["links"], "link kind")
    g = PortGroup(name, spec["attach"], spec["lanes"], spec.get("split", False))
    clash = [n for n in g.nodes if n in top.get("nodes", {}) or n in top.get("arrays", {})]
    if clash:
        raise TopologyError(path, where, f"port node '{clash[0]}' is already a node or array of the chip's top block")
    return g


def _lanes_link(links: dict, kind: str, lanes: int) -> str:
    """The link kind carrying ``lanes`` lanes of ``kind`` (added to ``links`` if new)."""
    if lanes == 1:
        return kind
    name = f"{kind}__x{lanes}"
    links.setdefault(name, dict(links[kind], bw_gbps=links[kind]["bw_gbps"] * lanes))
    return name


def _member(path: str, where: str, ref: str, chips: int, groups: dict) -> tuple[int, str]:
    m = _MEMBER.match(ref)
    if not m:
        raise TopologyError(path, where, f"expected 'chipI.GROUP' (a chip of the tray and one of its port groups), got {ref!r}")
    i, g = int(m.group(1)), m.group(2)
    if i >= chips:
        raise TopologyError(path, where, f"'{ref}': a tray has chips 0..{chips - 1}")
    if g not in groups:
        raise TopologyError(path, where, f"'{ref}': dangling port: no port group '{g}'{did_you_mean(g, groups)} "
                            f"(groups: {', '.join(groups)})")
    return i, g


def _tray(path: str, tray: dict, groups: dict, links: dict) -> tuple[dict, list]:
    """(direct[(i, j)] = (group of i, group of j), block links of the tray)."""
    direct, out = {}, []
    for k, link in enumerate(tray.get("links", [])):
        where = f"tray.links[{k}]"
        i, ga = _member(path, f"{where}.a", link["a"], tray["chips"], groups)
        j, gb = _member(path, f"{where}.b", link["b"], tray["chips"], groups)
        if i == j:
            raise TopologyError(path, where, f"joins chip {i} to itself")
        if (i, j) in direct:
            raise TopologyError(path, where, f"chips {i} and {j} are already joined")
        a, b = groups[ga], groups[gb]
        if a.lanes != b.lanes or a.split != b.split:
            raise TopologyError(path, where, f"port groups '{ga}' ({a.lanes} lanes) and '{gb}' ({b.lanes} lanes) "
                                "differ; a link pairs lane with lane")
        known(path, f"{where}.link", link["link"], links, "link kind")
        kind = _lanes_link(links, link["link"], 1 if a.split else a.lanes)
        out += [{"a": f"chip[{i}].{u}", "b": f"chip[{j}].{v}", "link": kind} for u, v in zip(a.nodes, b.nodes)]
        direct[(i, j)], direct[(j, i)] = (ga, gb), (gb, ga)
    return direct, out


def _tiers(path: str, switches: dict, groups: dict, trays: int) -> list:
    """The tiers bottom-up, each with its switch count; errors for a cycle, a dangling
    ``down``, two tiers over one thing and a top tier of more than one switch."""
    below = {}
    for name, spec in switches.items():
        down = spec["down"]
        if down not in groups and down not in switches:
            raise TopologyError(path, f"switches.{name}.down", f"'{down}' is neither a port group nor a switch tier"
                                f"{did_you_mean(down, list(groups) + list(switches))}")
        if down in below:
            raise TopologyError(path, f"switches.{name}.down", f"tier '{below[down]}' is already over '{down}'")
        below[down] = name
    for name in switches:
        seen, cur = [name], switches[name]["down"]
        while cur in switches:
            if cur in seen:
                chain = " -> ".join(seen[seen.index(cur):] + [cur])
                raise TopologyError(path, f"switches.{name}.down", f"the tiers form a cycle ({chain}, each over the next)")
            seen.append(cur)
            cur = switches[cur]["down"]
    bottoms = [n for n, s in switches.items() if s["down"] in groups]
    if len(bottoms) > 1:
        raise TopologyError(path, f"switches.{bottoms[1]}.down", f"a second tier over port groups (tier "
                            f"'{bottoms[0]}' is one); tiers form one chain")
    tiers, units = [], trays
    cur = bottoms[0] if bottoms else None
    while cur is not None:
        spec = switches[cur]
        if spec["down"] in switches and "lanes" not in spec:
            raise TopologyError(path, f"switches.{cur}", "missing field 'lanes' (lanes per link to the tier below)")
        units = -(-units // spec["per"])
        tiers.append(Tier(cur, spec["down"], spec["per"], units))
        cur = below.get(cur)
    if tiers and tiers[-1].count > 1:
        t = tiers[-1]
        raise TopologyError(path, f"switches.{t.name}", f"a switch with no uplink: {t.count} switches ('{t.down}' "
                            f"below, {t.per} each) and no tier above joins them; add a tier with down = '{t.name}'")
    return tiers


def _switch_links(switches: dict, tiers: list, groups: dict, links: dict, trays: int, chips: int) -> list:
    out = []
    for k, t in enumerate(tiers):
        spec = switches[t.name]
        if k == 0:
            g = groups[t.down]
            kind = _lanes_link(links, spec["link"], 1 if g.split else g.lanes)
            for tray in range(trays):
                sw = f"{t.name}_{tray // t.per}"
                out += [{"a": f"tray[{tray}].chip[{c}].{node}", "b": sw, "link": kind}
                        for c in range(chips) for node in g.nodes]
        else:
            kind = _lanes_link(links, spec["link"], spec["lanes"])
            out += [{"a": f"{t.down}_{i}", "b": f"{t.name}_{i // t.per}", "link": kind}
                    for i in range(tiers[k - 1].count)]
    return out
