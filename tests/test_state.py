"""Every process-wide cache and context variable of kbtorch is in one registry
(``kbtorch.state``), and ``kbtorch.reset()`` empties and resets them all."""
import contextvars
import importlib
import pkgutil

import kbtorch
from kbtorch import state

def _modules():
    for info in pkgutil.walk_packages(kbtorch.__path__, "kbtorch."):
        if info.name != "kbtorch.__main__":
            yield importlib.import_module(info.name)


def _found():
    caches, found_vars = [], []
    for mod in _modules():
        for value in vars(mod).values():
            if isinstance(value, contextvars.ContextVar):
                found_vars.append(value)
            owners = [value] + (list(vars(value).values()) if isinstance(value, type) and value.__module__ == mod.__name__ else [])
            caches += [v for v in owners if hasattr(v, "cache_clear") and getattr(v, "__module__", None) == mod.__name__]
    return caches, found_vars


def test_every_cache_and_context_var_is_registered():
    caches, found_vars = _found()
    reg = state.registered()
    ids = {id(c) for c in reg["caches"].values()}
    assert [c for c in caches if id(c) not in ids] == []
    assert {id(v) for v in found_vars} <= {id(v) for v in reg["context_vars"].values()}
    assert len(reg["context_vars"]) == 8


def test_reset_empties_them():
    kbtorch.topology.load_machine("ahbm")
    kbtorch.reset()
    for name, c in state.registered()["caches"].items():
        assert (c.cache_info().currsize if hasattr(c, "cache_info") else len(c)) == 0, name
    for var, default in state._VARS.values():
        assert var.get() == default


def test_reset_of_one_module_keeps_the_rest():
    from kbtorch.tensor.graph import capture
    capture._CACHE["k"] = 1
    with kbtorch.use("tests/data/tiny.toml") as machine:
        kbtorch.reset("kbtorch.tensor.graph.capture")
        assert capture._CACHE == {} and kbtorch.current_machine() is machine
    try:
        kbtorch.reset("kbtorch.no_such_module")
    except KeyError as exc:
        assert "no_such_module" in str(exc)
    else:
        raise AssertionError("an unknown prefix is refused")
