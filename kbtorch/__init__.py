"""kbtorch: a PyTorch front end to a discrete-event simulator of LLM kernels on AHBM.

Importing kbtorch registers the ``"ahbm"`` torch device (``kbtorch.tensor.device``). The
machine it models is ``kbtorch.current_machine()``, chosen with ``kbtorch.use``.
"""
from .profiler import profile
from .state import reset
from .tensor.device import register as _register
from .tensor.graph import compile as _compile
from .tensor.graph.capture import Graph as graph
from .tensor.graph.static_calls import graphed
from .tensor.hbm import HbmFull, check_hbm, hbm_peaks, reset_hbm_peaks
from .tensor.parallel.expert_parallel import ExpertParallel, expert_parallel
from .tensor.parallel.pipeline_parallel import PipelineParallel, pipeline_parallel
from .tensor.parallel.plan import ParallelStyle, parallelize_module
from .tensor.parallel.transfer import chip_transfer_ns
from .tensor.parallel.tensor_parallel import ColwiseParallel, ReplicateParallel, RowwiseParallel, tp_plan
from .tensor.placement.mesh import Mesh, chip_mesh, init_device_mesh, replica
from .tensor.placement.spec import Partial, Replicate, Shard, default_spec, home
from .tensor.tensor import distribute_tensor, timing_only
from .topology import current_machine, use
from .kernel import current_fidelity, use_fidelity

_register()
_compile.listen_for_breaks()

__all__ = ["graph", "graphed", "ColwiseParallel", "ExpertParallel", "HbmFull", "Mesh", "ParallelStyle", "Partial",
           "PipelineParallel", "Replicate", "ReplicateParallel", "RowwiseParallel", "Shard", "check_hbm", "chip_mesh", "chip_transfer_ns", "current_fidelity", "current_machine", "default_spec", "distribute_tensor",
           "expert_parallel", "hbm_peaks", "home", "init_device_mesh", "parallelize_module", "pipeline_parallel", "profile",
           "replica", "reset", "reset_hbm_peaks", "timing_only", "tp_plan", "use", "use_fidelity"]
