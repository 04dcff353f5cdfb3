"""The schema of a topology file, as data: every section, every component kind, every field.

A field is one line: ``"bw_gbps": req(POS_NUM)`` (required) or ``"description": opt(STR)``.
Value types are :class:`Value` (a leaf with a test and the words of its error message),
:class:`Record` (a table with known keys), :class:`Map` (a table of free names, every value
of one schema), :class:`Seq` (a list of one schema) and :class:`Variant` (a record whose
fields depend on its ``kind``). ``kbtorch.topology.load.validate`` walks a document against
:data:`TOP`; docs/topology-format.md lists the same tables for readers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
DIRS = ("both", "a->b", "b->a")
#: NOTE: a bound on every number (int or float) keeps derived picosecond values finite
#: (1e308 ns overflows to inf when scaled to ps) while leaving room for any real machine.
MAX_NUMBER = 1e12
MAX_CHANNELS = 4096      # NOTE: a memory keeps one timestamp per channel


def _number(v) -> bool:
    # NOTE: the bound also refuses inf and nan (nan compares false) and never converts a
    # huge int to float (math.isfinite(10**400) would raise OverflowError).
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= MAX_NUMBER


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) <= MAX_NUMBER


@dataclass(frozen=True)
class Value:
    """A leaf: ``test(value)`` says whether it is allowed; ``words`` follow 'expected'."""

    words: str
    test: Callable[[object], bool]


@dataclass(frozen=True)
class Field:
    schema: object
    required: bool = False


@dataclass(frozen=True)
class Record:
    """A table with these keys; ``one_of`` groups need exactly one of their keys present,
    ``less`` pairs (a, b) need a < b when both are present."""

    fields: dict
    one_of: tuple = ()
    less: tuple = ()


@dataclass(frozen=True)
class Map:
    """A table of free keys (``key`` checks their spelling), each value of ``value``."""

    value: object
    key: Value | None = None
    non_empty: bool = False


@dataclass(frozen=True)
class Seq:
    item: object


@dataclass(frozen=True)
class Variant:
    """A record whose ``tag`` field picks the extra fields: ``common`` + ``kinds[tag]``."""

    tag: str
    common: dict
    kinds: dict = field(default_factory=dict)


def req(schema) -> Field:
    return Field(schema, True)


def opt(schema) -> Field:
    return Field(schema, False)


STR = Value("a non-empty string", lambda v: isinstance(v, str) and v != "")
NAME = Value("a name of letters, digits and '_' (not starting with a digit)",
             lambda v: isinstance(v, str) and NAME_RE.match(v) is not None)
BOOL = Value("true or false", lambda v: isinstance(v, bool))
POS_NUM = Value("a finite positive number", lambda v: _number(v) and v > 0)
NONNEG_NUM = Value("a finite non-negative number", lambda v: _number(v) and v >= 0)
POS_INT = Value("a positive integer", lambda v: _integer(v) and v > 0)
NONNEG_INT = Value("a non-negative integer", lambda v: _integer(v) and v >= 0)
CHANNELS = Value(f"a positive integer of at most {MAX_CHANNELS}", lambda v: _integer(v) and 0 < v <= MAX_CHANNELS)
STR_LIST = Value("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
REFS = Value("a node reference or a list of them",
             lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)))
SHAPE = Value("a non-empty list of positive integers",
              lambda v: isinstance(v, list) and len(v) > 0 and all(POS_INT.test(x) for x in v))
DIR = Value(f"one of {', '.join(repr(d) for d in DIRS)}", lambda v: isinstance(v, str) and v in DIRS)

MACHINE = Record({
    "name": req(STR),
    "description": opt(STR),
    "flit_bytes": req(POS_INT),
    "page_bytes": req(POS_INT),
    "clock_ghz": req(POS_NUM),
    "top": req(STR),
    "pe_block": req(STR),
    "route_order": req(STR_LIST),
    "route_reset": opt(STR_LIST),
    "pe_roles": opt(Map(STR, key=NAME)),
})

#: Hardware-logical descriptor bytes of each command; a composite's is ``composite`` plus
#: ``move`` per read or write move and ``stage`` per engine stage it uses.
DESCRIPTORS = Record({name: req(NONNEG_INT) for name in
                      ("dma", "compute", "send", "fetch", "store", "composite", "move", "stage")})

ISSUE = Record({
    "fixed_cycles": req(NONNEG_NUM),
    "per_byte_cycles": req(NONNEG_NUM),
    "composite_cap_bytes": req(NONNEG_INT),
    "descriptor_bytes": req(DESCRIPTORS),
})

#: Kernel launch (optional; without it programs start at t = 0 on every PE's CP). ``node``
#: is the launching control processor, named as seen from a PE: the innermost block around
#: the PE that has a node of that name provides it (``dcp``: each chip's own DCP).
LAUNCH = Record({
    "node": req(NAME),
    "message_bytes": req(POS_INT),
    "fixed_ns": req(NONNEG_NUM),
})

#: Multi-path transport (optional; without it: single-path routing). ``policy`` is checked
#: against ``multipath.POLICIES`` when the machine is compiled (``validate.check_routing``).
ROUTING = Record({
    "policy": req(STR),
    "max_paths": opt(POS_INT),
    "port_kind": opt(STR),
    "adaptive": opt(BOOL),
    "relays": opt(NONNEG_INT),
})

LINK = Record({
    "kind": req(STR),
    "bw_gbps": req(POS_NUM),
    "prop_ns": req(NONNEG_NUM),
})

MEMORY = Record({
    "channels": req(CHANNELS),
    "channel_gbps": req(POS_NUM),
    "burst_bytes": req(POS_INT),
    "capacity_gib": opt(POS_NUM),
    "capacity_mib": opt(POS_NUM),
}, one_of=(("capacity_gib", "capacity_mib"),))
TFLOPS = req(Map(POS_NUM, non_empty=True))           # dtype -> TFLOP/s
NO_FIELDS = Record({})

COMPONENT = Variant("kind", common={
    "kind": req(STR),
    "overhead_ns": opt(NONNEG_NUM),
    "transit": opt(BOOL),
    "multicast": opt(BOOL),
}, kinds={
    "cpu": NO_FIELDS,
    "scheduler": NO_FIELDS,
    "dma": NO_FIELDS,
    "ipcq": NO_FIELDS,
    "gemm": Record({"tflops": TFLOPS}),
    "math": Record({"tflops": TFLOPS, "flops_per_element": req(Map(POS_INT, non_empty=True))}),
    "tcm": Record({"capacity_mib": req(POS_NUM), "scratch_mib": opt(NONNEG_NUM)},
                  less=(("scratch_mib", "capacity_mib"),)),
    "hbm": MEMORY,
    "sram": MEMORY,
    "router": NO_FIELDS,
    "hbm_ctrl": NO_FIELDS,
    "ucie_phy": NO_FIELDS,
    "pcie_ep": NO_FIELDS,
    "nic": NO_FIELDS,
})

CONNECT = Record({
    "dim": req(STR),
    "a": req(STR),
    "b": req(STR),
    "link": req(STR),
    "wrap": opt(BOOL),
})

ARRAY = Record({
    "block": req(STR),
    "count": opt(POS_INT),
    "grid": opt(SHAPE),
    "dims": opt(STR_LIST),
    "connect": opt(Seq(CONNECT)),
}, one_of=(("count", "grid"),))

BLOCK_LINK = Record({
    "a": req(STR),
    "b": req(REFS),
    "link": req(STR),
    "dir": opt(DIR),
})

BIND = Record({
    "array": req(STR),
    "attr": req(STR),
    "nodes": req(REFS),
})

BLOCK = Record({
    "nodes": opt(Map(STR, key=NAME)),
    "arrays": opt(Map(ARRAY, key=NAME)),
    "links": opt(Seq(BLOCK_LINK)),
    "bind": opt(Seq(BIND)),
})

TOP = Record({
    "machine": req(MACHINE),
    "issue": req(ISSUE),
    "launch": opt(LAUNCH),
    "routing": opt(ROUTING),
    "links": req(Map(LINK)),
    "components": req(Map(COMPONENT)),
    "blocks": req(Map(BLOCK)),
})

# --- System files (kbtorch/topology/system.py): chips joined by trays and switch tiers ---

SYSTEM = Record({
    "name": req(STR),
    "description": opt(STR),
    "chip": req(STR),
    "chip_overrides": opt(Map(Value("any value", lambda v: True))),
    "trays": req(POS_INT),
})

#: A port group: ``lanes`` ports (a chip's NICs, e.g. Maia's ANCs) on the chip node ``attach``.
PORT = Record({
    "attach": req(NAME),
    "component": req(STR),
    "lanes": req(POS_INT),
    "link": req(STR),
    "split": opt(BOOL),
})

TRAY_LINK = Record({
    "a": req(STR),
    "b": req(STR),
    "link": req(STR),
})

TRAY = Record({
    "chips": req(POS_INT),
    "links": opt(Seq(TRAY_LINK)),
})

#: A switch tier: switches of ``component`` over ``down`` (a port group of the chips, or
#: the tier below), ``per`` trays (or switches below) each, ``lanes`` x ``link`` per downlink.
SWITCH = Record({
    "component": req(STR),
    "down": req(NAME),
    "per": req(POS_INT),
    "link": req(STR),
    "lanes": opt(POS_INT),
})

SYSTEM_TOP = Record({
    "system": req(SYSTEM),
    "links": req(Map(LINK, key=NAME)),
    "components": req(Map(COMPONENT, key=NAME)),
    "ports": req(Map(PORT, key=NAME, non_empty=True)),
    "tray": req(TRAY),
    "switches": opt(Map(SWITCH, key=NAME)),
    "routing": opt(ROUTING),
})
