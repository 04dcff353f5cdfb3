"""kbtorch: a PyTorch front end to a discrete-event simulator of LLM kernels on AHBM.

Importing kbtorch registers the ``"ahbm"`` torch device (``kbtorch.tensor.device``).
"""
from .profiler import profile
from .tensor.device import register as _register
from .tensor.placement import Mesh, Partial, Replicate, Shard
from .tensor.redistribute import distribute_tensor
from .tensor.tensor import timing_only

_register()

__all__ = ["Mesh", "Partial", "Replicate", "Shard", "distribute_tensor", "profile", "timing_only"]
