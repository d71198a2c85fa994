"""Fixtures of the kernel tests."""
import os

import pytest
import torch

from tensorrt_llm.ops.launch import cuda_kernels_available


@pytest.fixture
def seed(request):
    """A fresh seed per test, kept with the test's report (user_properties) so that a failure can
    be run again with the same data."""
    seed = int.from_bytes(os.urandom(4), "little")
    request.node.user_properties.append(("seed", seed))
    return seed


@pytest.fixture
def gen(seed):
    """A CPU generator seeded with the test's seed: inputs are made on the CPU."""
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def needs_kernels():
    """A GPU test fails, not skips, where tensorrt_llm.bindings has no CUDA kernels."""
    if not cuda_kernels_available():
        pytest.fail("tensorrt_llm.bindings has no CUDA kernels: build with `python build_wheel.py -a native -s -i`")
