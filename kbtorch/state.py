"""The process-wide caches and context variables of kbtorch, in one registry, and ``reset()``.

Every module-level cache (an ``functools.lru_cache``/``cache`` function or method, a dict or
list that remembers what was computed) is registered where it is made, with ``@cache`` (or
``cache(obj, name)`` for a container), and every ``ContextVar`` is made by
:func:`context_var`. :func:`registered` lists them by name; :func:`reset` (``kbtorch.reset()``)
empties every cache and sets every context variable back to its default, in the current
context: a test or a sweep point then starts as a fresh process would.

NOTE: the bottom layer (beside ``units`` and ``limits``): any layer registers here, and this
module imports nothing of kbtorch. A registration names what is reset; nothing is ever
looked up through the registry, so registering changes no behaviour.
"""
from __future__ import annotations

from contextvars import ContextVar

__all__ = ["cache", "context_var", "registered", "reset"]
_CACHES: dict = {}           # name -> the cache (has cache_clear() or clear())
_VARS: dict = {}             # name -> (ContextVar, its default)


def cache(obj, name: str | None = None):
    """Register ``obj``, a process-wide cache, and return it: a function or method wrapped by
    ``functools.lru_cache``/``cache`` (``@cache`` above it; named ``module.qualname``) or a
    container with ``clear()`` (``name`` required)."""
    if name is None:
        name = f"{obj.__module__}.{obj.__qualname__}"
    if not (hasattr(obj, "cache_clear") or hasattr(obj, "clear")):
        raise TypeError(f"kbtorch.state.cache: {name} has neither cache_clear() nor clear()")
    if _CACHES.get(name, obj) is not obj:
        raise ValueError(f"kbtorch.state.cache: '{name}' is registered already")
    _CACHES[name] = obj
    return obj


def context_var(name: str, default) -> ContextVar:
    """A new ``ContextVar(name, default=default)``, registered: :func:`reset` sets it back."""
    if name in _VARS:
        raise ValueError(f"kbtorch.state.context_var: '{name}' is registered already")
    var: ContextVar = ContextVar(name, default=default)
    _VARS[name] = (var, default)
    return var


def registered() -> dict:
    """``{"caches": {name: cache}, "context_vars": {name: ContextVar}}`` of every module imported."""
    return {"caches": dict(_CACHES), "context_vars": {name: var for name, (var, _) in _VARS.items()}}


def reset(prefix: str | None = None) -> None:
    """Empty every registered cache and set every registered context variable to its default;
    with ``prefix`` (``"kbtorch.tensor.graph.capture"``), only the caches whose names start
    with it, the context variables untouched (a test drops one module's memory of earlier runs
    and keeps its machine)."""
    found = [obj for name, obj in _CACHES.items() if prefix is None or name.startswith(prefix)]
    if prefix is not None and not found:
        raise KeyError(f"kbtorch.reset: no registered cache is named {prefix!r}...")
    for obj in found:
        if hasattr(obj, "cache_clear"):
            obj.cache_clear()
        else:
            obj.clear()
    if prefix is None:
        for var, default in _VARS.values():
            var.set(default)
