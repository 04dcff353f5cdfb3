"""The tile-kernel API: commands, composites, semaphores, named buffers at every memory level."""
from .api import PEContext, build, contexts, launch, run_programs
from .steady import FIDELITIES, Obtained, by_fidelity, current_fidelity, fast_forward, use_fidelity

__all__ = ["FIDELITIES", "Obtained", "PEContext", "build", "by_fidelity", "contexts", "current_fidelity",
           "fast_forward", "launch", "run_programs", "use_fidelity"]
