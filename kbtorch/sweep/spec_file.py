"""Reading a sweep spec file safely, before anything is expanded: its size
(``MAX_SPEC_BYTES``), encoding and nesting (``KBTORCH_MAX_DEPTH``), every fault a
``SpecError`` naming the file and the field."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

from ..limits import LIMITS, limit

__all__ = ["MAX_SPEC_BYTES", "SpecError", "limit_of", "read"]

#: A spec names its points; a larger file is refused before it is parsed.
MAX_SPEC_BYTES = 256 << 10
_QUOTED = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'')


class SpecError(ValueError):
    """A malformed sweep spec: the message names the file and the field."""

    def __init__(self, path: str, field: str, message: str):
        super().__init__(f"{Path(path).name}: {field}: {message}")


def limit_of(path: str, name: str) -> int:
    try:
        return limit(name)
    except ValueError as exc:
        raise SpecError(path, "environment", str(exc)) from None


def read(path: str) -> dict:
    """The parsed TOML of ``path``: at most ``MAX_SPEC_BYTES``, nested at most ``KBTORCH_MAX_DEPTH``."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        raise SpecError(path, "file", f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(path, "file", f"larger than {MAX_SPEC_BYTES >> 10} KiB: a sweep spec names its points, "
                        "it does not list them")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(path, "file", f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    most = limit_of(path, "depth")
    # NOTE: before parsing: tomllib takes quadratic time on a long dotted key.
    bare = _QUOTED.sub('""', text)
    deep = re.search(r"(?:[\w-]+[ \t]*\.[ \t]*){%d,}" % (most + 1), bare)
    if deep:
        raise SpecError(path, f"line {bare.count(chr(10), 0, deep.start()) + 1}",
                        f"a dotted key nested more than {most} levels deep (set {LIMITS['depth'][0]} to raise it)")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(path, "file", f"not valid TOML: {exc}") from None
    except RecursionError:
        raise SpecError(path, "file", "tables or lists nested too deeply to read") from None
    where = _too_deep(doc, most)
    if where is not None:
        raise SpecError(path, where, f"nested more than {most} levels deep (set {LIMITS['depth'][0]} to raise it)")
    return doc


def _too_deep(doc: dict, most: int) -> str | None:
    """The dotted field where ``doc`` nests deeper than ``most`` levels, else None (no recursion)."""
    stack = [(doc, "", 0)]
    while stack:
        node, where, depth = stack.pop()
        if depth > most:
            return where
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, child in items:
            if isinstance(child, (dict, list)):
                stack.append((child, f"{where}[{key}]" if isinstance(node, list) else f"{where}.{key}".lstrip("."),
                              depth + 1))
    return None
