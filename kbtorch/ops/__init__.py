"""Hand-written tile kernels, one file per op family; each family registers itself
(``contract.register``) when its module is imported."""
import importlib
import pkgutil


def load_families() -> None:
    """Import every module of this package so that the registry (``contract.families()``)
    holds every family. NOTE: discovered, not listed: a new family's file is all it takes."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
