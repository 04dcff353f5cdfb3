"""The ``"ahbm"`` torch device and its tensors (see ``device`` and ``tensor``)."""
from .placement import Mesh, Partial, Replicate, Shard, Spec, default_spec
from .tensor import AhbmTensor, distribute_tensor
from . import (ops_attention, ops_copy, ops_factory, ops_index, ops_matmul, ops_meta, ops_moe,  # registers
               ops_pointwise, ops_reduce, ops_shape)  # the op handlers

__all__ = ["AhbmTensor", "Mesh", "Partial", "Replicate", "Shard", "Spec", "default_spec", "distribute_tensor",
           "ops_attention", "ops_copy", "ops_factory", "ops_index", "ops_matmul", "ops_meta", "ops_moe", "ops_pointwise",
           "ops_reduce", "ops_shape"]
