"""Which machine the device, the profiler, the ops and the models use.

``use(NAME|PATH|Machine)`` makes a topology the process default; as a context manager it
holds inside the block only (context-local: other threads and tasks keep theirs) and
restores the previous default on exit. With neither, the environment variable
``KBTORCH_TOPOLOGY`` names it, else ``DEFAULT_MACHINE`` (ahbm). ``as_machine(x)`` is the one resolution every
entry point uses: None -> the current machine, a name or path -> loaded, a Machine -> itself.
"""
from __future__ import annotations

import contextvars
import os

from .. import state
from .errors import TopologyError
from .machine import DEFAULT_MACHINE, Machine, load_machine

ENV = "KBTORCH_TOPOLOGY"
_SCOPED: contextvars.ContextVar = state.context_var("kbtorch_machine", None)
_PROCESS: list = [None]
#: Bumped by every use() made, entered or left: a use() entered right after it was made is a
#: block's; one entered later was a process choice already.
_GENERATION: list = [0]


def as_machine(x=None) -> Machine:
    """A Machine from None (the current one), a topology name or path, or a Machine."""
    if x is None:
        return current_machine()
    if isinstance(x, Machine):
        return x
    if isinstance(x, (str, os.PathLike)):
        return load_machine(os.fspath(x))
    raise TypeError(f"expected a topology name, a path or a Machine, got {type(x).__name__} {x!r}")


def current_machine() -> Machine:
    """The machine in force here: ``with use(...)``, else ``use(...)``, else $KBTORCH_TOPOLOGY, else ``DEFAULT_MACHINE``."""
    scoped = _SCOPED.get()
    if scoped is not None:
        return scoped
    if _PROCESS[0] is not None:
        return _PROCESS[0]
    name = os.environ.get(ENV)
    if not name:
        return load_machine(DEFAULT_MACHINE)
    try:
        return load_machine(name)
    except TopologyError as exc:
        raise TopologyError(exc.path, exc.entry, f"{exc.message} (from ${ENV}={name!r})") from None


class use:
    """Select the machine: ``kbtorch.use("torus6")`` for the process, or ``with kbtorch.use(path):``
    for a block. The topology is loaded (and validated) at once; a bad one raises and leaves
    the machine in force as it was."""

    def __init__(self, topology):
        if topology is None:
            raise TypeError("kbtorch.use: expected a topology name, a path or a Machine, got None")
        self.machine = as_machine(topology)
        self._previous, self._tokens = _PROCESS[0], []
        _PROCESS[0] = self.machine
        _GENERATION[0] += 1
        self._made = _GENERATION[0]

    def __enter__(self) -> Machine:
        # NOTE: as a context manager (``with use(x):``) the choice is the block's alone: the
        # process default set by __init__ goes back at once, so other threads never see it.
        # A use() kept and entered later (after other use() calls or blocks) made a process
        # choice already: that stays as it is. Tokens are a stack: the same object may be
        # entered again inside its own block, and each exit restores what its entry replaced.
        if self._made == _GENERATION[0] and _PROCESS[0] is self.machine:
            _PROCESS[0] = self._previous
        _GENERATION[0] += 1
        self._tokens.append(_SCOPED.set(self.machine))
        return self.machine

    def __exit__(self, *exc) -> None:
        _GENERATION[0] += 1
        _SCOPED.reset(self._tokens.pop())
