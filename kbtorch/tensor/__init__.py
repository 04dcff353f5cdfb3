"""The ``"ahbm"`` torch device and its tensors (see ``device`` and ``tensor``)."""
from .handlers import load_handlers
from .placement import Mesh, Partial, Replicate, Shard, Spec, default_spec
from .tensor import AhbmTensor, distribute_tensor

load_handlers()

__all__ = ["AhbmTensor", "Mesh", "Partial", "Replicate", "Shard", "Spec", "default_spec", "distribute_tensor"]
