"""Topology files (TOML, data only) -> checked documents -> compiled machines, one straight line.

A file has five sections (see docs/topology-format.md), and an optional ``[launch]``: ``[machine]``, ``[issue]``,
``[links]`` (link kinds: ``bw_gbps``, ``prop_ns``), ``[components]`` (component types:
``kind``, ``overhead_ns``, ``transit`` and the fields of their kind), and
``[blocks.NAME]``: a block holds named nodes, arrays of nested blocks (``count`` or
``grid`` + ``connect`` rules that join neighbours along a dimension, with ``wrap`` for rings
and tori), links between its nodes, and ``bind`` entries that give array elements an
attribute (a PE's HBM slice). A system file (``system``) names a chip file and joins its chips.

The load path (``machine.load_machine(name, overrides)``); each step is one module and
hands its result to the next, none goes back to a step before it:

1. resolve (``sources``): the name -> the file (``topology_path``); a system's chip file
   (``chip_file``).
2. read and parse (``sources.read``, ``parse``): every file read once; ``Sources.key`` is the
   digest of all their bytes and the overrides: the content the rest is made from.
3. cached (``cache``)? A document resolved from that key is returned at once (steps 4-5 skip).
4. override and validate (``overrides``, then ``validate``, which owns the checks): the
   overrides set in the document, the schema checked; a system's chip file parsed,
   overridden (``chip_overrides``) and checked the same way and the system compiled over it
   (``system.compile_system``). -> :class:`Resolved`: the document a machine IS, its
   ``content_digest`` (computed once) and a system's layout, cached under the key.
5. compile (``machine.Machine``): blocks and size checked (``validate``), blocks expanded
   (``expand``), the graph built and checked (``validate``), routers and routing policy;
   a system's chip machine loaded by the same path. Cached (``cache``) under the path and
   the digest: one object per content in a process.

A worker given a resolved document (``machine.machine_of_doc``: a sweep point, an unpickled
machine) starts at step 5: nothing is read or checked again but a system's chip file, for
its layout. The loader knows no hierarchy names: SIP, CUBE and PE exist only in the files.
Every error is a :class:`TopologyError` naming the file and the entry at fault.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import cache
from ..errors import TopologyError
from .expand import Expander, RawTopology
from .overrides import CHIP_PREFIX, apply_overrides, blame, lookup
from .parse import is_system, parse, read_toml
from .schema import SYSTEM_TOP
from .sources import Sources, chip_file, read
from ..system import compile_system
from .validate import check_blocks, check_chip, check_pes, check_size, element_limit, validate

__all__ = ["RawTopology", "Resolved", "resolve", "resolve_doc", "of_doc", "expand", "load_raw", "override_entry"]


@dataclass(frozen=True)
class Resolved:
    """A checked document: ``doc`` is what a machine IS (the file's document with the overrides
    set; a system's compiled over its chip file, with its own document as ``system_file`` so
    that a worker given only the document has the layout), ``digest`` its ``content_digest``,
    ``layout`` a system's ``SystemLayout``."""

    path: str
    doc: dict
    digest: str | None
    layout: object = None


def resolve(path: str | Path, overrides: dict | None = None) -> Resolved:
    """Steps 1-4 of the load path: the file's checked document, once per content."""
    src = read(str(path), overrides)
    return cache.get(("doc", src.path, src.key), lambda: _checked(src, overrides))


def resolve_doc(path: str | Path, overrides: dict | None = None) -> dict:
    """The file's document with ``overrides`` applied, checked against the schema: the content
    a machine is built from (and its key in a sweep). Raises TopologyError on bad input."""
    return resolve(path, overrides).doc


def of_doc(path: str, doc: dict, digest: str | None = None) -> Resolved:
    """The :class:`Resolved` of a document :func:`resolve_doc` returned (not checked again;
    a system's layout compiled again from its ``system_file``)."""
    layout = _system(doc["system_file"], path)[1] if "system_file" in doc else None
    return Resolved(path, doc, cache.content_digest(doc) if digest is None else digest, layout)


def _checked(src: Sources, overrides) -> Resolved:
    path, doc = src.path, src.doc
    try:
        if is_system(doc):
            _override_system(doc, path, overrides)
            compiled, layout = _system(doc, path, src)
            doc = dict(compiled, system_file=doc)
        else:
            if overrides is not None:
                apply_overrides(doc, overrides, path)
            validate(doc, path)
            layout = None
    except TopologyError as exc:
        raise blame(exc, overrides) from None
    return Resolved(path, doc, cache.content_digest(doc), layout)


def _override_system(doc: dict, path: str, overrides) -> None:
    """Overrides applied and schema checked, in place. An override ``chip.X`` (``CHIP_PREFIX``)
    sets field ``X`` of the chip file: it joins ``system.chip_overrides`` (over the file's own
    entry for ``X``) and is checked with the chip file when the system compiles."""
    chip = {k: v for k, v in overrides.items() if isinstance(k, str) and k.startswith(CHIP_PREFIX)} \
        if isinstance(overrides, dict) else {}
    if overrides is not None:
        apply_overrides(doc, {k: v for k, v in overrides.items() if k not in chip} if chip else overrides, path)
    validate(doc, path, SYSTEM_TOP)
    if chip:
        own = doc["system"].get("chip_overrides", {})
        doc["system"]["chip_overrides"] = {**own, **{k.removeprefix(CHIP_PREFIX): v for k, v in chip.items()}}


def _system(doc: dict, path: str, src: Sources | None = None) -> tuple:
    """A checked system document compiled to a chip-style document over its chip file, and its
    layout; ``src``: what step 2 read (the chip file's bytes are not read again)."""
    chip_path = chip_file(path, doc["system"]["chip"])
    data = src.chip_data if src is not None and src.chip == chip_path else None
    chip = read_toml(chip_path) if data is None else parse(chip_path, data)
    check_chip(chip, chip_path, path)
    apply_overrides(chip, doc["system"].get("chip_overrides", {}), chip_path)
    validate(chip, chip_path)
    check_blocks(chip, chip_path, ("top",))
    return compile_system(doc, path, chip, chip_path)


def expand(resolved: Resolved, max_elements: int | None = None) -> RawTopology:
    """Step 5's first half: the blocks and size of a checked document checked, then expanded
    into nodes and edges (``max_elements``: see :func:`validate.element_limit`)."""
    doc, path = resolved.doc, resolved.path
    check_blocks(doc, path)
    check_size(doc, path, element_limit(path, max_elements))
    raw = RawTopology(path=path, machine=doc["machine"], issue=doc["issue"], links=doc["links"],
                      launch=doc.get("launch"), routing=doc.get("routing"), system=resolved.layout)
    Expander(raw, doc["components"], doc["blocks"]).run()
    check_pes(raw)
    return raw


def load_raw(path: str | Path, overrides: dict | None = None, max_elements: int | None = None,
             doc: dict | None = None) -> RawTopology:
    """Read, check and expand a topology file into nodes and edges.

    ``overrides`` maps dotted paths of the file to new values (``{"links.noc.bw_gbps": 512}``),
    set before the schema check. ``doc``: a document :func:`resolve_doc` returned (read,
    overridden and checked already: not read or checked again). ``max_elements`` caps nodes +
    directed links (default :data:`kbtorch.topology.load.validate.DEFAULT_MAX_ELEMENTS`, or
    $KBTORCH_MAX_ELEMENTS). Raises TopologyError on bad input.
    """
    path = str(path)
    return expand(resolve(path, overrides) if doc is None else of_doc(path, doc), max_elements)


def override_entry(path: str | Path, dotted):
    """The value at the override path ``dotted`` of topology file ``path`` (what a sweep
    scales, or shows as the base value). A system file's ``chip.X`` is field ``X`` of its chip
    file, after the system's ``chip_overrides``. TopologyError naming the file and the entry
    when there is none."""
    path = str(path)
    doc = read_toml(path)
    if not (is_system(doc) and isinstance(dotted, str) and dotted.startswith(CHIP_PREFIX)):
        return lookup(doc, dotted, path)
    _override_system(doc, path, None)
    chip_path = chip_file(path, doc["system"]["chip"])
    chip = read_toml(chip_path)
    apply_overrides(chip, doc["system"].get("chip_overrides", {}), chip_path)
    try:
        return lookup(chip, dotted.removeprefix(CHIP_PREFIX), chip_path)
    except TopologyError as exc:
        raise TopologyError(path, dotted, f"{exc.message} (of the chip file {Path(chip_path).name})") from None
