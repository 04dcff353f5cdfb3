"""Step 1 of loading (see ``pipeline``): a topology's name -> its files, every byte read once.

A machine is built from the topology file and, for a system, its chip file. Its identity is
the content of all of them plus the overrides (``Sources.key``: an edit to a system's chip
file is a new machine, in this process too), and a command's outputs must never overwrite
any of them (``source_files``).
"""
from __future__ import annotations

import hashlib
import importlib.resources
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import TopologyError, did_you_mean
from .overrides import freeze_overrides
from .parse import is_system, parse, read_bytes

__all__ = ["TOPOLOGY_DIR", "topology_dirs", "topology_path", "chip_file", "Sources", "read", "source_files"]
#: The shipped topologies: package data (kbtorch/topologies/*.toml), found in a checkout and in
#: an installed wheel alike.
TOPOLOGY_DIR = Path(str(importlib.resources.files("kbtorch") / "topologies"))


def topology_dirs() -> list[str]:
    """Where a bare topology name is looked up: $KBTORCH_TOPOLOGIES, then the shipped ones."""
    return [d for d in os.environ.get("KBTORCH_TOPOLOGIES", "").split(os.pathsep) if d] + [str(TOPOLOGY_DIR)]


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


def chip_file(path: str, name: str) -> str:
    """The chip file ``name`` of system file ``path``: a path (relative to the system file's
    directory) or a topology name looked up like ``load_machine``'s."""
    where = Path(path).parent
    if name.endswith(".toml") or "/" in name:
        cand = Path(name) if Path(name).is_absolute() else where / name
        if cand.is_file():
            return str(cand)
    else:
        for d in [where, *topology_dirs()]:
            if (Path(d) / f"{name}.toml").is_file():
                return str(Path(d) / f"{name}.toml")
    raise TopologyError(path, "system.chip", f"unknown chip file '{name}' (a path relative to {where}, "
                        "or a topology name)")


@dataclass(frozen=True)
class Sources:
    """What a machine is read from: ``doc``, the file's parsed document (fresh: the loader sets
    overrides in it), ``chip``, a system's chip file and ``chip_data`` its bytes (None: none,
    or one not found or not readable: compiling reports it), and ``key``, the digest of every
    byte read and the overrides (None: overrides with no canonical form, never cached)."""

    path: str
    doc: dict
    chip: str | None
    chip_data: bytes | None
    key: str | None


def read(path: str, overrides=None) -> Sources:
    """The file ``path`` read and parsed, and its chip file's bytes read (not parsed: the chip
    file is checked after the system file, in the order the faults are reported)."""
    data = read_bytes(path)
    doc = parse(path, data)
    chip = _chip_of(path, doc, overrides)
    chip_data = _bytes(chip)
    digest = hashlib.sha256()
    for part in (path, data, chip or "", chip_data or b""):
        part = part.encode() if isinstance(part, str) else part
        digest.update(len(part).to_bytes(8, "big") + part)
    try:
        frozen = freeze_overrides(overrides, path)
    except TopologyError:
        return Sources(path, doc, chip, chip_data, None)
    digest.update(repr(frozen).encode())
    return Sources(path, doc, chip, chip_data, digest.hexdigest())


def _chip_of(path: str, doc: dict, overrides) -> str | None:
    system = doc.get("system") if is_system(doc) else None
    name = system.get("chip") if isinstance(system, dict) else None
    # NOTE: an override may name another chip file: that one is what the machine reads.
    name = overrides.get("system.chip", name) if isinstance(overrides, dict) else name
    if not isinstance(name, str):
        return None
    try:
        return chip_file(path, name)
    except TopologyError:
        return None


def _bytes(path: str | None) -> bytes | None:
    # NOTE: a chip file that cannot be read is read again when compiling, which reports why.
    try:
        return Path(path).read_bytes() if path else None
    except OSError:
        return None


def source_files(path: str) -> tuple[str, ...]:
    """Absolute paths of the files the machine of topology file ``path`` reads (itself first).
    NOTE: a file that cannot be read or names no chip file yields what it can: loading it
    reports the fault with its own message."""
    path = os.path.abspath(path)
    try:
        chip = read(path).chip
    except TopologyError:
        return (path,)
    return (path,) if chip is None else (path, os.path.abspath(chip))
