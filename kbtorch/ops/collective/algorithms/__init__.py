"""The collective algorithms, one module each, each registered by ``@algorithm``
(``registry``) when imported. Every module of this package is imported here (as the op
families are, ``kbtorch.ops.load_families``), so a new algorithm is one file; ``ALGOS`` and
``LINE_ALGOS`` are derived from the registry."""
import importlib
import pkgutil

from .registry import ALGORITHMS

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")

#: Every algorithm, by rank (the tie-break of every automatic choice).
ALGOS = tuple(sorted(ALGORITHMS, key=lambda name: ALGORITHMS[name].rank))
#: The algorithms run on several groups sharing one chip (``Algorithm.lines``).
LINE_ALGOS = tuple(name for name in ALGOS if ALGORITHMS[name].lines)
