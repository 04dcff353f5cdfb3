"""The tile-kernel API (commands, composites, semaphores, buffers with memory levels)."""
from .api import PEContext, build, launch, run_programs
from .buffers import HBM, LEVELS, SRAM, TCM, Buf, TcmArena, TcmOverflow

__all__ = ["PEContext", "build", "launch", "run_programs", "HBM", "SRAM", "TCM", "LEVELS", "Buf", "TcmArena", "TcmOverflow"]
