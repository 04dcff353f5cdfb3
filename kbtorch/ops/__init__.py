"""Hand-written tile kernels, one file per op family."""
