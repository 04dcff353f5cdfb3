"""The ``"ahbm"`` torch device and its tensors (see ``device`` and ``tensor``)."""
from .placement import Mesh, Partial, Replicate, Shard, Spec
from .tensor import AhbmTensor
from . import ops_copy, ops_elementwise, ops_matmul, ops_norm  # registers the op handlers

__all__ = ["AhbmTensor", "Mesh", "Partial", "Replicate", "Shard", "Spec", "ops_copy", "ops_elementwise", "ops_matmul", "ops_norm"]
