"""Topology files (TOML, data only) -> flat lists of nodes and directed links.

A file has five sections (see docs/topology-format.md), and an optional ``[launch]``: ``[machine]``, ``[issue]``,
``[links]`` (link kinds: ``bw_gbps``, ``prop_ns``), ``[components]`` (component types:
``kind``, ``overhead_ns``, ``transit`` and the fields of their kind), and
``[blocks.NAME]``: a block holds named nodes, arrays of nested blocks (``count`` or
``grid`` + ``connect`` rules that join neighbours along a dimension, with ``wrap`` for rings
and tori), links between its nodes, and ``bind`` entries that give array elements an
attribute (a PE's HBM slice).

Loading is a pipeline: read the file (read_toml), apply overrides (overrides.py), check the
schema (schema.py, validate.py), check nesting and size before expanding (size.py), expand
(expand.py). The loader knows no hierarchy names: SIP, CUBE and PE exist only in the files.
Every error is a :class:`TopologyError` naming the file and the entry at fault.
"""
from __future__ import annotations

import copy
import hashlib
import importlib.resources
import os
import stat
import tomllib
from pathlib import Path

from .errors import TopologyError, did_you_mean
from .expand import Expander, RawTopology
from .overrides import CHIP_PREFIX, apply_overrides, blame, lookup
from .size import check_size, element_limit
from .system import check_system, chip_file, compile_system, is_system
from .validate import content_digest, validate

__all__ = ["RawTopology", "load_raw", "read_toml", "resolve_doc", "override_entry", "topology_dirs", "TOPOLOGY_DIR"]
#: The shipped topologies: package data (kbtorch/topologies/*.toml), found in a checkout and in
#: an installed wheel alike.
TOPOLOGY_DIR = Path(str(importlib.resources.files("kbtorch") / "topologies"))


def topology_dirs() -> list[str]:
    """Where a bare topology name is looked up: $KBTORCH_TOPOLOGIES, then the shipped ones."""
    return [d for d in os.environ.get("KBTORCH_TOPOLOGIES", "").split(os.pathsep) if d] + [str(TOPOLOGY_DIR)]


def read_toml(path: str | Path) -> dict:
    """The parsed document; TopologyError if the path is not a readable file of UTF-8 TOML."""
    name = str(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise TopologyError(name, "file", "no such topology file") from None
    except OSError as exc:
        raise TopologyError(name, "file", f"cannot read: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise TopologyError(name, "file", "is a directory, not a topology file")
    if not stat.S_ISREG(mode):
        raise TopologyError(name, "file", "is not a regular file")
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TopologyError(name, "file", f"cannot read: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TopologyError(name, "file", f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(name, "file", f"not valid TOML: {exc}") from None
    except RecursionError:
        # NOTE: tomllib parses nested arrays and inline tables recursively.
        raise TopologyError(name, "file", "not valid TOML: values nested too deeply") from None


def resolve_doc(path: str | Path, overrides: dict | None = None) -> dict:
    """The file's document with ``overrides`` applied, checked against the schema: the content
    a machine is built from (and its key in a sweep). Raises TopologyError on bad input."""
    path = str(path)
    doc = read_toml(path)
    try:
        if is_system(doc):
            check_system(doc, path, overrides)
            compiled, _ = _compiled(doc, path)
            # NOTE: the compiled document holds the chip's content (what the machine IS); its
            # system file rides along so that a worker given only the document has the layout.
            return dict(compiled, system_file=doc)
        if overrides is not None:
            apply_overrides(doc, overrides, path)
        validate(doc, path)
    except TopologyError as exc:
        raise blame(exc, overrides) from None
    return doc


def override_entry(path: str | Path, dotted):
    """The value at the override path ``dotted`` of topology file ``path`` (what a sweep
    scales, or shows as the base value). A system file's ``chip.X`` is field ``X`` of its chip
    file, after the system's ``chip_overrides``. TopologyError naming the file and the entry
    when there is none."""
    path = str(path)
    doc = read_toml(path)
    if not (is_system(doc) and isinstance(dotted, str) and dotted.startswith(CHIP_PREFIX)):
        return lookup(doc, dotted, path)
    check_system(doc, path, None)
    chip_path = chip_file(path, doc["system"]["chip"], topology_dirs())
    chip = read_toml(chip_path)
    apply_overrides(chip, doc["system"].get("chip_overrides", {}), chip_path)
    try:
        return lookup(chip, dotted.removeprefix(CHIP_PREFIX), chip_path)
    except TopologyError as exc:
        raise TopologyError(path, dotted, f"{exc.message} (of the chip file {Path(chip_path).name})") from None


def load_raw(path: str | Path, overrides: dict | None = None, max_elements: int | None = None,
             doc: dict | None = None) -> RawTopology:
    """Read, check and expand a topology file into nodes and edges.

    ``overrides`` maps dotted paths of the file to new values (``{"links.noc.bw_gbps": 512}``),
    set before the schema check. ``doc``: a document :func:`resolve_doc` returned (read,
    overridden and checked already: not read or checked again). ``max_elements`` caps nodes +
    directed links (default :data:`kbtorch.topology.size.DEFAULT_MAX_ELEMENTS`, or
    $KBTORCH_MAX_ELEMENTS). Raises TopologyError on bad input.
    """
    path = str(path)
    if doc is None:
        doc = resolve_doc(path, overrides)
    layout = None
    if "system_file" in doc:
        doc, layout = _compiled(doc["system_file"], path)
    machine, blocks = doc["machine"], doc["blocks"]
    for key in ("top", "pe_block"):
        if machine[key] not in blocks:
            raise TopologyError(path, f"machine.{key}", f"unknown block '{machine[key]}'{did_you_mean(machine[key], blocks)}")
    check_size(doc, path, element_limit(path, max_elements))
    raw = RawTopology(path=path, machine=machine, issue=doc["issue"], links=doc["links"], launch=doc.get("launch"),
                      routing=doc.get("routing"), system=layout)
    Expander(raw, doc["components"], blocks).run()
    if not raw.pes:
        raise TopologyError(path, "machine.pe_block", f"block '{machine['pe_block']}' is never instantiated")
    return raw


#: Compiled systems by the digest of their (overridden, checked) system document: a system
#: is compiled once per process, whether its document comes from a file or from a driver.
_COMPILED: dict = {}


def _compiled(doc: dict, path: str) -> tuple:
    """(chip-style document, layout) of a checked system document, compiled once per content."""
    # NOTE: the chip file's bytes are part of the key: an edit to the chip file a system names
    # is a new machine, in this process too.
    key = (content_digest(doc), path, _file_digest(chip_file(path, doc["system"]["chip"], topology_dirs())))
    if key[0] is None or key not in _COMPILED:
        _COMPILED[key] = _system(copy.deepcopy(doc), path)
    compiled, layout = _COMPILED[key]
    return copy.deepcopy(compiled), layout


def _file_digest(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def _system(doc: dict, path: str) -> tuple:
    """A checked system file compiled to a chip-style document over its chip file, and its layout."""
    chip_path = chip_file(path, doc["system"]["chip"], topology_dirs())
    chip = read_toml(chip_path)
    if is_system(chip):
        raise TopologyError(path, "system.chip", f"'{chip_path}' is a system file; a system's chips are chip files")
    apply_overrides(chip, doc["system"].get("chip_overrides", {}), chip_path)
    validate(chip, chip_path)
    top = chip["machine"]["top"]
    if top not in chip["blocks"]:
        raise TopologyError(chip_path, "machine.top", f"unknown block '{top}'{did_you_mean(top, chip['blocks'])}")
    return compile_system(doc, path, chip, chip_path)
