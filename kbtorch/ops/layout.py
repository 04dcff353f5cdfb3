"""Buffer layout rules every tile kernel shares: the accumulator, alignment, HBM pages and
the TCM a kernel may plan its buffers in.

Each number is the machine's (``page_bytes``, the TCM's access granule, capacities) or the
dtype table's: none lives here.
"""
from __future__ import annotations

from .contract import DTYPES

#: Bytes of one accumulator element: GEMM and attention accumulate in fp32.
ACC_BYTES = DTYPES["fp32"].bytes


def align(nbytes: int, granule: int) -> int:
    """``nbytes`` rounded up to a multiple of ``granule``."""
    return -(-nbytes // granule) * granule


def page_align(machine, nbytes: int) -> int:
    """``nbytes`` rounded up to whole pages (``page_bytes``). NOTE: operands and regions in
    HBM start on page boundaries, as a host runtime places whole tensors."""
    return align(nbytes, machine.page_bytes)


def tcm_granule(machine, pe: int) -> int:
    """Bytes of one access of PE ``pe``'s TCM (its buffers are aligned to it)."""
    return machine.granule(machine.memory(pe, "tcm"))


def tcm_align(machine, pe: int, nbytes: int) -> int:
    """``nbytes`` as a TCM buffer of PE ``pe`` occupies it: whole granules."""
    return align(nbytes, tcm_granule(machine, pe))


def tcm_budget(machine, pe: int) -> int:
    """Bytes of PE ``pe``'s TCM a kernel may plan buffers in: its allocatable capacity less
    one page. NOTE: the page is slack for the alignment of the kernel's few buffers."""
    return machine.capacity("tcm", pe) - machine.page_bytes
