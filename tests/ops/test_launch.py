"""ops/launch.py's helpers that need no kernel: the device capability lookup."""
import pytest
import torch

from tensorrt_llm.ops.launch import cuda_capability


@pytest.mark.gpu
def test_cuda_capability_of_every_spelling_of_a_device():
    want = torch.cuda.get_device_capability(torch.cuda.current_device())
    assert cuda_capability() == want
    assert cuda_capability(torch.device("cuda")) == want  # no index: the current device
    assert cuda_capability(torch.device("cuda", torch.cuda.current_device())) == want
    for index in range(torch.cuda.device_count()):
        assert cuda_capability(index) == torch.cuda.get_device_capability(index)
        assert isinstance(cuda_capability(index), tuple)
