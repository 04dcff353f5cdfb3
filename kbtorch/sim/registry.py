"""Handlers keyed by command type: how the simulator, symmetry reduction and the resource
model treat each kind of command.

A new command type is added by registering a handler for it in every registry that must
know it (``pe.EXECUTE``, ``symmetry.PATHS``, ``resources.LOAD``); looking up a type a registry
has no handler for raises ``UnknownCommand`` naming the type and the registry.

NOTE: a dict from type to handler, not ``functools.singledispatch``: the PE dispatch runs
once per command started (millions in a large run). Measured per lookup (Python 3.11, the
six command types): the dict about 30 ns, the former ``isinstance`` chain about 100 ns,
``singledispatch`` about 290 ns. One mechanism serves every registry. A subclass of a
registered type gets its nearest registered base's handler (found along its MRO on the
first lookup, then cached), as ``isinstance`` did.
"""
from __future__ import annotations


class UnknownCommand(TypeError):
    """A registry has no handler for a command type."""


class Registry(dict):
    """``registry[type(cmd)]`` is the handler of ``cmd``; filled by ``register``."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.own: dict[type, object] = {}

    def register(self, *types: type):
        """Decorator: ``fn`` handles commands of each of ``types`` (returned unchanged, so it
        can decorate a method)."""
        def deco(fn):
            for t in types:
                if t in self.own:
                    raise ValueError(f"{self.name}: a handler for {t.__name__} is already registered")
                self.own[t] = fn
            self.clear()
            self.update(self.own)
            return fn
        return deco

    def __missing__(self, cls: type):
        for base in cls.__mro__[1:]:
            if base in self.own:
                fn = self[cls] = self.own[base]
                return fn
        raise UnknownCommand(f"{self.name}: no handler for command type {cls.__name__} "
                             f"(registered: {', '.join(sorted(t.__name__ for t in self.own))})")
