import pytest
import torch

from tensorrt_llm import Network, net_guard
from tensorrt_llm import functional as F
from tensorrt_llm.reference_executor import ReferenceExecutor


def network():
    net = Network()
    with net_guard(net):
        ids = net.add_input("input_ids", "int32", [-1], [("num_tokens", (1, 4, 8))])
        pos = net.add_input("position_ids", "int32", [-1], [("num_tokens", (1, 4, 8))])
        table = F.constant(torch.randn(10, 4), name="emb")
        h = F.embedding(ids, table)
        h = h + F.embedding(pos, table)
        net.mark_debug(h)
        net.mark_output(F.argmax(h, -1), "best")
    return net


def feed(n=3, m=None):
    return {"input_ids": torch.arange(n, dtype=torch.int32),
            "position_ids": torch.arange(m if m is not None else n, dtype=torch.int32)}


def test_run_returns_outputs_and_debug_tensors():
    net = network()
    out = ReferenceExecutor(net).run(feed())
    table = net.weights["emb"]
    h = table[:3] + table[:3]
    assert set(out) == {"best", net.debug_outputs[0]}
    torch.testing.assert_close(out[net.debug_outputs[0]], h)
    assert torch.equal(out["best"], h.argmax(-1))


@pytest.mark.parametrize("bad,msg", [
    ({"input_ids": torch.zeros(3, dtype=torch.int32)}, r"missing \['position_ids'\]"),
    ({**feed(), "extra": torch.zeros(1)}, r"unexpected \['extra'\]"),
    ({**feed(), "input_ids": torch.zeros(3, dtype=torch.int64)}, "expected dtype torch.int32"),
    ({**feed(), "input_ids": torch.zeros(3, 1, dtype=torch.int32)}, "expected rank 1"),
    (feed(9), r"num_tokens\) = 9 is outside \[1, 8\]"),
    (feed(3, 4), "dim 'num_tokens' is 3 in input 'input_ids' but 4 in 'position_ids'"),
])
def test_feed_is_checked(bad, msg):
    with pytest.raises(ValueError, match=msg):
        ReferenceExecutor(network()).run(bad)


def test_missing_weight_and_unknown_op_fail_at_construction():
    net = network()
    del net.weights["emb"]
    with pytest.raises(ValueError, match="emb"):
        ReferenceExecutor(net)
    with pytest.raises(NotImplementedError, match="argmax"):
        ReferenceExecutor(network(), ops={"embedding": None, "add": None})


@pytest.mark.gpu
def test_runs_on_cuda_like_on_cpu():
    net = network()
    cpu = ReferenceExecutor(net).run(feed())
    gpu = ReferenceExecutor(net, device="cuda").run({k: v.cuda() for k, v in feed().items()})
    for name in cpu:
        torch.testing.assert_close(gpu[name].cpu(), cpu[name])
    with pytest.raises(ValueError, match="expected a tensor on cuda"):
        ReferenceExecutor(net, device="cuda").run(feed())
