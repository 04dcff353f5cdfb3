"""Step 5 of loading (see ``pipeline``): the one cache of topology loading, keyed by content.

An entry is found by what it was made from, never by a file's name or mtime: a resolved
document by ``Sources.key`` (every byte read, and the overrides), a machine by its path and
the digest of its resolved document (``content_digest``: what a machine IS, so a touched file
is the same machine and an edited chip file a new one). ``clear()`` drops what only the
cache holds (``kbtorch.reset()`` does).

NOTE: the ``SIZE`` latest entries are held; an older one is kept while something else still
holds it (a machine that tensors and modules use), so one content is one object for as long
as it is in use, and a sweep over many machines does not keep them all alive.
"""
from __future__ import annotations

import hashlib
import json
import weakref
from collections import OrderedDict

from ... import state

__all__ = ["content_digest", "get", "clear", "SIZE"]
#: Entries held whether used or not (the latest first to stay).
SIZE = 32
_RECENT: OrderedDict = OrderedDict()
_LIVE: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def content_digest(doc: dict) -> str | None:
    """sha256 of ``doc`` as canonical JSON (sorted keys): what a machine IS, whatever its
    file's name or mtime; None for a document too deep or odd to serialise (never valid)."""
    try:
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    except (RecursionError, ValueError, TypeError):
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def get(key, make):
    """The entry of ``key``, made by ``make()`` on a miss (nothing is kept when ``make`` raises;
    a key holding None is never cached)."""
    if any(part is None for part in key):
        return make()
    hit = _RECENT.get(key)
    if hit is None:
        hit = _LIVE.get(key)
    if hit is None:
        hit = make()
    _RECENT[key] = _LIVE[key] = hit
    _RECENT.move_to_end(key)
    while len(_RECENT) > SIZE:
        _RECENT.popitem(last=False)
    return hit


def clear() -> None:
    """Forget every entry held only by the cache. NOTE: an entry something else still holds
    stays findable, so one content remains one object while in use (a machine a fixture or a
    module holds is not duplicated by a later load after ``kbtorch.reset()``)."""
    _RECENT.clear()


state.cache(_RECENT, "kbtorch.topology.load.cache._RECENT")
