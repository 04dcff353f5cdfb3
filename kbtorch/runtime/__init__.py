"""Host-facing runtime API: memory allocation, data deployment and kernel launch."""
from .allocator import AllocationError, Allocator, Buf, Memories
from .runtime import Runtime

__all__ = ["AllocationError", "Allocator", "Buf", "Memories", "Runtime"]
