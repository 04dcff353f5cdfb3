"""kbtorch: a PyTorch front end to a discrete-event simulator of LLM kernels on AHBM.

Importing kbtorch registers the ``"ahbm"`` torch device (``kbtorch.tensor.device``). The
machine it models is ``kbtorch.current_machine()``, chosen with ``kbtorch.use``.
"""
from .profiler import profile
from .tensor.device import register as _register
from .tensor.graph import Graph as graph
from .tensor.graphed import graphed
from . import compile as _compile
from .tensor.chips import chip_mesh
from .tensor.expert_parallel import expert_parallel
from .tensor.memory import HbmFull, check_hbm
from .tensor.mesh import init_device_mesh, replica
from .tensor.parallel import ColwiseParallel, ReplicateParallel, RowwiseParallel, parallelize_module, tp_plan
from .tensor.pipeline import pipeline_parallel
from .tensor.placement import Mesh, Partial, Replicate, Shard, default_spec, home
from .tensor.tensor import distribute_tensor, timing_only
from .topology import current_machine, use

_register()
_compile.listen_for_breaks()

__all__ = ["graph", "graphed", "ColwiseParallel", "HbmFull", "Mesh", "Partial", "Replicate", "ReplicateParallel",
           "RowwiseParallel", "Shard", "check_hbm", "chip_mesh", "current_machine", "default_spec", "distribute_tensor",
           "expert_parallel", "home", "init_device_mesh", "parallelize_module", "pipeline_parallel", "profile",
           "replica", "timing_only", "tp_plan", "use"]
