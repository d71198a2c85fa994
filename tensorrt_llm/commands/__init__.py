"""Console commands installed with the wheel (trtllm-build, ...)."""
