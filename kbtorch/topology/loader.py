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

import os
import stat
import tomllib
from pathlib import Path

from .errors import TopologyError, did_you_mean
from .expand import Expander, RawTopology
from .overrides import apply_overrides, blame
from .size import check_size, element_limit
from .validate import validate

__all__ = ["RawTopology", "load_raw", "read_toml", "resolve_doc"]


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
    if overrides is not None:
        apply_overrides(doc, overrides, path)
    try:
        validate(doc, path)
    except TopologyError as exc:
        raise blame(exc, overrides) from None
    return doc


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
    machine, blocks = doc["machine"], doc["blocks"]
    for key in ("top", "pe_block"):
        if machine[key] not in blocks:
            raise TopologyError(path, f"machine.{key}", f"unknown block '{machine[key]}'{did_you_mean(machine[key], blocks)}")
    check_size(doc, path, element_limit(path, max_elements))
    raw = RawTopology(path=path, machine=machine, issue=doc["issue"], links=doc["links"], launch=doc.get("launch"))
    Expander(raw, doc["components"], blocks).run()
    if not raw.pes:
        raise TopologyError(path, "machine.pe_block", f"block '{machine['pe_block']}' is never instantiated")
    return raw
