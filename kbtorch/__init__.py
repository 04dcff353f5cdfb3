"""kbtorch: a PyTorch front end to a discrete-event simulator of LLM kernels on AHBM.

Importing kbtorch registers the ``"ahbm"`` torch device (``kbtorch.tensor.device``).
"""
from .profiler import profile
from .tensor.device import register as _register
from .tensor.tensor import timing_only

_register()

__all__ = ["profile", "timing_only"]
