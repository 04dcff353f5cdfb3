"""The tile-kernel API: commands, composites, semaphores, named buffers at every memory level."""
from .api import PEContext, build, contexts, launch, run_programs

__all__ = ["PEContext", "build", "contexts", "launch", "run_programs"]
