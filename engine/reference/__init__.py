"""Reference implementations the kernels are checked against (float64 attention over pages, the torch ops
the fused kernels replace), shared by the unit tests and bench/gpu_check. Nothing served imports them."""
