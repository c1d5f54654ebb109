"""bench/gpu_check: the GPU checks in one run (run.py): the Triton kernels against references, the engine
against transformers, a worker's forward on devices, speed. `python -m bench.gpu_check [--smoke] [--json]`."""
