"""The registry of collective algorithms: ``@algorithm(name, rank=..., lines=...)`` on the
function that builds an algorithm's steps. Every list of algorithms (``ALGOS``,
``LINE_ALGOS``, the op family's and the command line's choices) is derived from it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Algorithm:
    """A collective algorithm: ``build(kind, grid, root) -> (blocks, steps)`` (raises
    ``CollectiveError`` where it does not apply). ``rank``: its place in ``ALGOS``, the
    tie-break of every automatic choice (lower first). ``lines``: every step goes from one
    member to one other, so it runs on several groups sharing a chip (``LINE_ALGOS``)."""

    name: str
    rank: int
    lines: bool
    build: Callable


#: Algorithm name -> ``Algorithm``, filled as the algorithms' modules are imported.
ALGORITHMS: dict = {}


def algorithm(name: str, *, rank: int, lines: bool = False) -> Callable:
    """Register the decorated function as the builder of algorithm ``name``."""
    def register(build: Callable) -> Callable:
        if name in ALGORITHMS or any(a.rank == rank for a in ALGORITHMS.values()):
            raise ValueError(f"algorithm '{name}' or rank {rank} is registered twice")
        ALGORITHMS[name] = Algorithm(name, rank, lines, build)
        return build
    return register
