"""The files a topology's machine is read from: the file itself and, for a system, its chip
file. A machine's identity is the content of all of them (an edit to a system's chip file is
a new machine), and a command's outputs must never overwrite any of them."""
from __future__ import annotations

import os

from .errors import TopologyError
from .loader import read_toml, topology_dirs
from .system import chip_file, is_system

__all__ = ["source_files", "sources_stamp"]


def source_files(path: str) -> tuple[str, ...]:
    """Absolute paths of the files the machine of topology file ``path`` reads (itself first).
    NOTE: a file that cannot be read or names no chip file yields what it can: loading it
    reports the fault with its own message."""
    path = os.path.abspath(path)
    try:
        doc = read_toml(path)
    except TopologyError:
        return (path,)
    chip = doc.get("system", {}).get("chip") if is_system(doc) else None
    if not isinstance(chip, str):
        return (path,)
    try:
        return (path, os.path.abspath(chip_file(path, chip, topology_dirs())))
    except TopologyError:
        return (path,)


def sources_stamp(path: str) -> tuple:
    """``((file, mtime ns, size), ...)`` of :func:`source_files`: what a cached machine of
    ``path`` is valid for (an edit to any of its files changes it)."""
    out = []
    for f in source_files(path):
        try:
            st = os.stat(f)
            out.append((f, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((f, None, None))
    return tuple(out)

