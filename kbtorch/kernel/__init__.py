"""The tile-kernel API (commands, composites, semaphores, buffers with memory levels)."""
from .api import PEContext, build, launch
from .buffers import HBM, LEVELS, SRAM, TCM, Buf, TcmArena, TcmOverflow

__all__ = ["PEContext", "build", "launch", "HBM", "SRAM", "TCM", "LEVELS", "Buf", "TcmArena", "TcmOverflow"]
