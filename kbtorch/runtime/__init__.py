"""Host-facing runtime API: memory allocation, data deployment and kernel launch."""
from .allocator import ALIGN, AllocationError, Allocator, capacity_bytes
from .runtime import LEVELS, Buffer, Runtime

__all__ = ["ALIGN", "AllocationError", "Allocator", "capacity_bytes", "LEVELS", "Buffer", "Runtime"]
