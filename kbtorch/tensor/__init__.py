"""The ``"ahbm"`` torch device and its tensors (see ``device`` and ``tensor``)."""
from .placement import Mesh, Partial, Replicate, Shard, Spec
from .tensor import AhbmTensor

__all__ = ["AhbmTensor", "Mesh", "Partial", "Replicate", "Shard", "Spec"]
