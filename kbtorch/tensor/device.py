"""The ``"ahbm"`` torch device, in pure Python.

``register()`` (called by ``import kbtorch``) makes PrivateUse1 a Python backend named
``ahbm`` with torch's helper ``torch.utils.backend_registration._setup_privateuseone_for_python_backend``
(device guard, device module, hooks, generated ``Tensor.ahbm()``-style methods), then
registers the three PrivateUse1 kernels that ``.to("ahbm")`` and the factory functions need:
``aten::empty.memory_format``, ``aten::empty_strided`` and ``aten::_copy_from``, and makes
``nn.Module._apply`` all or nothing (``module.apply_all_or_nothing``). The kernels create
and fill ``AhbmTensor`` wrappers on the current machine (``kbtorch.use``); every other op
reaches ``AhbmTensor.__torch_dispatch__``.

NOTE: the helper is private and may only run once per process; ``register`` is idempotent
and refuses to run if PrivateUse1 already carries another name.
"""
from __future__ import annotations

import torch

from ..topology import current_machine
from .hbm import hbm_book, hbm_peaks, reset_hbm_peaks
from .module import apply_all_or_nothing
from .placement.spec import default_spec
from .tensor import DEVICE, AhbmTensor, is_timing_only

_LIB = None


def register() -> None:
    """Set up the ``ahbm`` device once per process (later calls do nothing)."""
    global _LIB
    if _LIB is not None:
        return
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", DEVICE):
        raise RuntimeError(f"kbtorch: PrivateUse1 is already registered as '{current}'; cannot add '{DEVICE}'")
    if current != DEVICE:
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend
        _setup_privateuseone_for_python_backend(DEVICE)
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("empty.memory_format", _empty, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    # NOTE: moves of modules to and from ahbm must survive autograd's references and never
    # stop halfway (see ``module``).
    torch.nn.Module._apply = apply_all_or_nothing
    _random_state_is_the_hosts()
    torch.get_device_module(DEVICE).is_available = _available
    _memory_stats()
    _LIB = lib


def _random_state_is_the_hosts() -> None:
    """``torch.ahbm.get_rng_state``/``set_rng_state``/``manual_seed_all``: random values on
    ahbm are drawn on the host (``fill_``-like host writes), so its generator is the
    host's (what ``torch.random.fork_rng(device_type="ahbm")`` saves and restores)."""
    mod = torch.get_device_module(DEVICE)
    mod.get_rng_state = lambda device=None: torch.get_rng_state()
    mod.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    # NOTE: ``torch.manual_seed`` seeds the host generator and then calls these: nothing left to do.
    mod.manual_seed = mod.manual_seed_all = lambda seed: None


def _memory_stats() -> None:
    """``torch.ahbm.memory_allocated()``, ``max_memory_allocated()`` and
    ``reset_peak_memory_stats()``, as ``torch.cuda``'s: the bytes of the fullest HBM node of
    the current machine, now and at its peak (per chip: ``kbtorch.hbm_peaks()``)."""
    mod = torch.get_device_module(DEVICE)
    mod.memory_allocated = lambda device=None: max(a.used_bytes for a in hbm_book(current_machine()).nodes.values())
    mod.max_memory_allocated = lambda device=None: max(hbm_peaks().values())
    mod.reset_peak_memory_stats = lambda device=None: reset_hbm_peaks()


def _available() -> bool:
    """``torch.ahbm.is_available()``: True, but while dynamo traces (a tracing context is
    set). NOTE: fake tensors treat a device that is not available as one not to initialise:
    they then never run a real op onto it to fold a constant (``.to("ahbm")`` of a scalar
    constant would otherwise make a real ahbm tensor inside dynamo's fake pass)."""
    from torch._guards import TracingContext
    return TracingContext.try_get() is None


def _home(dtype) -> str:
    """Where a new tensor's value lives: nowhere (meta) for a floating-point tensor in
    timing-only mode; on the host otherwise.

    NOTE: integer and bool tensors (token ids, positions, masks) are small and steer
    control flow (``generate()``), so they keep values even in timing-only mode."""
    floating = (dtype or torch.get_default_dtype()).is_floating_point
    return "meta" if is_timing_only() and floating else "cpu"


def _check_index(device) -> None:
    """One ``ahbm`` device (index 0) models the whole machine; another index is refused."""
    index = torch.device(device).index if device is not None else None
    if index not in (None, 0):
        raise RuntimeError(f"ahbm: device index {index} is out of range: the one device 'ahbm:0' models the whole "
                           f"machine '{current_machine().name}' (place tensors on its PEs with kbtorch.Mesh and "
                           f"placements, not with device indices)")


def _empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_index(device)
    value = torch.empty(size, dtype=dtype or torch.get_default_dtype(), device=_home(dtype))
    return AhbmTensor(value, default_spec(current_machine(), tuple(size)))


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_index(device)
    value = torch.empty_strided(size, stride, dtype=dtype or torch.get_default_dtype(), device=_home(dtype))
    return AhbmTensor(value, default_spec(current_machine(), tuple(size)))


def _copy_from(src, dst, non_blocking=False):
    """Host <-> ahbm copies (the runtime's untimed deploy and read-back); nothing to copy
    into a timing-only tensor."""
    value = src._value if isinstance(src, AhbmTensor) else src
    if isinstance(dst, AhbmTensor):
        if not dst._value.is_meta:
            dst._value.copy_(value)
    else:
        dst.copy_(value)
    return dst
