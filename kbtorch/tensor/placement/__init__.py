"""Where an ahbm tensor lives: placements (``Shard``, ``Replicate``, ``Partial``) and ``Spec``
(``spec``), the ``Mesh`` of PEs they are laid over (``mesh``, ``chips``), and the placement
rules of the op handlers (``sharding``)."""
from .mesh import Mesh
from .spec import Partial, Replicate, Shard, Spec, default_spec

__all__ = ["Mesh", "Partial", "Replicate", "Shard", "Spec", "default_spec"]
