"""Shared pytest set-up: markers.

gpu: the test needs a CUDA GPU (and the compiled CUDA kernels); it is skipped, with the reason,
where torch.cuda.is_available() is false. Run only those with `pytest -m gpu`.
"""
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped when torch.cuda.is_available() is false")


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)
