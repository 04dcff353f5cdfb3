"""Overrides for design-space sweeps: ``{"links.noc.bw_gbps": 512, ...}`` sets entries of the
parsed TOML document before it is validated, so an override passes the same schema as the
file. A path is dotted keys with optional list indices (``blocks.cube.links[4].link``) and
must name an entry the file has.
"""
from __future__ import annotations

import copy
import re

from ..errors import TopologyError, did_you_mean

#: An override of a system file under this prefix sets a field of its chip file
#: (``chip.links.noc.bw_gbps``), on top of the system's own ``system.chip_overrides``.
CHIP_PREFIX = "chip."
_PART = re.compile(r"^([^.\[\]]+)((?:\[\d+\])*)$")


def apply_overrides(doc: dict, overrides, path: str) -> None:
    """Set every ``dotted path -> value`` of ``overrides`` in ``doc`` (in place)."""
    _check_dict(overrides, path)
    for dotted, value in overrides.items():
        steps = _steps(dotted, path)
        parent = doc
        for i, step in enumerate(steps):
            _check_step(parent, step, steps[:i], dotted, path)
            if i + 1 < len(steps):
                parent = parent[step]
        # NOTE: a copy, so a later override or the loader never aliases the caller's value.
        parent[steps[-1]] = copy.deepcopy(value)


def lookup(doc: dict, dotted, path: str):
    """The entry of ``doc`` at the override path ``dotted``; TopologyError naming ``path`` and
    ``dotted`` when the file has no such entry."""
    steps, node = _steps(dotted, path), doc
    for i, step in enumerate(steps):
        _check_step(node, step, steps[:i], dotted, path)
        node = node[step]
    return node


def _steps(dotted, path: str) -> list:
    if not isinstance(dotted, str) or not dotted:
        raise TopologyError(path, "overrides", f"expected a dotted path like 'links.noc.bw_gbps', got {dotted!r}")
    steps: list = []
    for part in dotted.split("."):
        m = _PART.match(part)
        if not m:
            raise TopologyError(path, dotted, "override: not a dotted path like 'links.noc.bw_gbps' or 'blocks.cube.links[4].b'")
        steps.append(m.group(1))
        steps.extend(int(i) for i in re.findall(r"\d+", m.group(2)))
    return steps


def _check_step(parent, step, done: list, dotted: str, path: str) -> None:
    here = "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in done).lstrip(".") or "the top level"
    if isinstance(step, int):
        if not isinstance(parent, list) or step >= len(parent):
            size = f"a list of {len(parent)}" if isinstance(parent, list) else "not a list"
            raise TopologyError(path, dotted, f"override: the file has no entry {here}[{step}] ({here} is {size})")
    elif not isinstance(parent, dict) or step not in parent:
        hint = did_you_mean(step, parent) if isinstance(parent, dict) else f" ({here} is not a table)"
        raise TopologyError(path, dotted, f"override: the file has no entry '{step}' in {here}{hint}")


def blame(exc: TopologyError, overrides) -> TopologyError:
    """``exc`` with a note when the entry it names was set by one of ``overrides``."""
    # NOTE: a system's ``chip.X`` override is entry ``X`` of its chip file.
    hit = [k for k in overrides or () if isinstance(k, str) and any(
        exc.entry == e or exc.entry.startswith(e + ".") for e in (k, k.removeprefix(CHIP_PREFIX)))]
    return TopologyError(exc.path, exc.entry, f"{exc.message} (set by override '{hit[0]}')") if hit else exc


def freeze_overrides(overrides, path: str) -> tuple:
    """A hashable canonical form of ``overrides`` (a cache key); ``()`` for none."""
    if overrides is None:
        return ()
    _check_dict(overrides, path)
    key = _freeze(overrides)
    try:
        hash(key)
    except TypeError:
        raise TopologyError(path, "overrides", "values must be numbers, strings, booleans, lists or tables") from None
    return key


def thaw_overrides(key: tuple) -> dict | None:
    """The overrides dict of a :func:`freeze_overrides` key."""
    return _thaw(key) if key else None


def _check_dict(overrides, path: str) -> None:
    if not isinstance(overrides, dict):
        raise TopologyError(path, "overrides", f"expected a dict of dotted paths to values, got {type(overrides).__name__}")


def _freeze(value) -> tuple:
    # NOTE: the type tag keeps 1, 1.0 and True apart (they are equal as dict keys).
    if isinstance(value, dict):
        return ("dict", tuple((k, _freeze(v)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_freeze(v) for v in value))
    return (type(value).__name__, value)


def _thaw(frozen: tuple):
    tag, value = frozen
    if tag == "dict":
        return {k: _thaw(v) for k, v in value}
    if tag == "list":
        return [_thaw(v) for v in value]
    return tuple(_thaw(v) for v in value) if tag == "tuple" else value
