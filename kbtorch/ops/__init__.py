"""Hand-written tile kernels, one file per op family; each family registers itself
(``contract.register``) when its module is imported."""
import importlib

#: The modules of the shipped op families, in the order the command line lists them.
FAMILY_MODULES = ("gemm", "collective", "attention", "elementwise")


def load_families() -> None:
    """Import every shipped family so that the registry (``contract.families()``) holds it."""
    for name in FAMILY_MODULES:
        importlib.import_module(f"{__name__}.{name}")
