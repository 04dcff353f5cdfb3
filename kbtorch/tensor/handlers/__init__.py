"""The aten op handlers of the ahbm device, one file per group of ops; each registers its
handlers (``dispatch.register``) when its module is imported."""
import importlib
import pkgutil


def load_handlers() -> None:
    """Import every module of this package so that the dispatch registry holds every
    handler. NOTE: discovered, not listed (as op families are): a new file is all it takes."""
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
