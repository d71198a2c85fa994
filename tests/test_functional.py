"""Every op: shape/dtype inference at definition time, and its result through the
ReferenceExecutor against a plain torch computation on random data."""
import math

import pytest
import torch

from tensorrt_llm import Network, default_net, net_guard
from tensorrt_llm import functional as F
from tensorrt_llm.functional import Tensor
from tensorrt_llm.ops import OPS
from tensorrt_llm.reference_executor import ReferenceExecutor

DYN = ("n", (1, 3, 16))  # the range every dynamic dim in these tests gets


def evaluate(build, *values):
    """Declare one input per value (first dim dynamic), call build on them, run the
    network; returns (output Tensor(s), result(s))."""
    net = Network()
    with net_guard(net):
        inputs = []
        for i, v in enumerate(values):
            shape = list(v.shape)
            ranges = None
            if shape:
                shape[0] = -1
                ranges = [(f"d{i}", (0, v.shape[0], max(64, v.shape[0])))]
            inputs.append(net.add_input(f"in{i}", v.dtype, shape, ranges))
        outs = build(*inputs)
        outs_t = outs if isinstance(outs, tuple) else (outs,)
        for j, o in enumerate(outs_t):
            net.mark_output(o, f"out{j}")
    res = ReferenceExecutor(net).run({f"in{i}": v for i, v in enumerate(values)})
    results = tuple(res[f"out{j}"] for j in range(len(outs_t)))
    for o, r in zip(outs_t, results):  # the inferred spec matches what came out
        assert o.dtype == str(r.dtype).replace("torch.", "")
        assert len(o.shape) == r.dim() and all(s in (-1, rs) for s, rs in zip(o.shape, r.shape))
    return outs, (results if isinstance(outs, tuple) else results[0])


def close(a, b, tol=1e-5):
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


torch.manual_seed(0)
X = torch.randn(5, 6)
Y = torch.randn(5, 6)


@pytest.mark.parametrize("op,ref", [
    (F.add, torch.add), (F.sub, torch.sub), (F.mul, torch.mul), (F.div, torch.div),
    (lambda a, b: a + b, torch.add), (lambda a, b: a - b, torch.sub), (lambda a, b: a * b, torch.mul),
    (lambda a, b: a / b, torch.div),
])
def test_binary_ops(op, ref):
    out, got = evaluate(op, X, Y)
    assert out.shape == (-1, 6)
    close(got, ref(X, Y))


def test_broadcasting_and_scalars():
    row = torch.randn(6)
    out, got = evaluate(lambda a, b: a * b, X, row)
    assert out.shape == (-1, 6)
    close(got, X * row)
    _, got = evaluate(lambda a: 2.0 - a / 4 + 1, X)
    close(got, 2.0 - X / 4 + 1)
    _, got = evaluate(lambda a: -a, X)
    close(got, -X)
    _, got = evaluate(lambda a: a ** 3, X)
    close(got, X ** 3)
    col = torch.randn(5, 1)
    out, got = evaluate(F.add, X, col)
    close(got, X + col)


def test_broadcast_shape_rules():
    net = Network()
    with net_guard(net):
        a = net.add_input("a", "float32", [-1, 1, 4], [DYN])
        b = net.add_input("b", "float32", [3, 1], None)
        c = net.add_input("c", "float32", [-1], [DYN])
        assert (a + b).shape == (-1, 3, 4)
        assert (c + F.constant(torch.ones(1))).shape == (-1,)
        assert (c + F.constant(torch.ones(7))).shape == (7,)
        with pytest.raises(ValueError, match=r"add: shapes \[-1, 1, 4\] and \[3, 5\] do not broadcast"):
            a + net.add_input("d", "float32", [3, 5])
        with pytest.raises(ValueError, match="mul: dtype mismatch.*float32.*float16"):
            a * net.add_input("e", "float16", [4])


@pytest.mark.parametrize("op,ref", [
    (F.relu, torch.relu), (F.gelu, torch.nn.functional.gelu),
    (F.gelu_tanh, lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
    (F.silu, torch.nn.functional.silu), (F.sigmoid, torch.sigmoid), (F.tanh, torch.tanh),
])
def test_unary_ops(op, ref):
    out, got = evaluate(op, X)
    assert out.shape == (-1, 6)
    close(got, ref(X))


def test_matmul_and_linear_shapes_and_values():
    a, b = torch.randn(7, 576), torch.randn(576, 12)
    out, got = evaluate(F.matmul, a, b)
    assert out.shape == (-1, 12)
    close(got, a @ b, 1e-4)
    _, got = evaluate(lambda p, q: p @ q, a, b)
    close(got, a @ b, 1e-4)
    batched, m = torch.randn(2, 3, 4), torch.randn(5, 4)
    _, got = evaluate(lambda p, q: F.matmul(p, q, transb=True), batched, m)
    close(got, batched @ m.T)
    _, got = evaluate(lambda p, q: F.matmul(p, q, transa=True), torch.randn(4, 3), torch.randn(4, 2))
    w, bias, x = torch.randn(9, 6), torch.randn(9), torch.randn(4, 6)
    out, got = evaluate(F.linear, x, w, bias)
    close(got, x @ w.T + bias)
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, 576], [DYN])
        w = F.constant(torch.zeros(576, 1536))
        assert F.matmul(x, w).shape == (-1, 1536)
        with pytest.raises(ValueError, match=r"matmul: inner dims differ: \[-1, 576\] x \[1536, 576\]"):
            F.matmul(x, F.constant(torch.zeros(1536, 576)))
        with pytest.raises(ValueError,
                           match=r"linear: input \[-1, 576\] does not match weight \[out, in\] \[576, 1536\]"):
            F.linear(x, w)


def test_softmax_and_norms():
    _, got = evaluate(lambda t: F.softmax(t, dim=0), X)
    close(got, X.softmax(0))
    w, b = torch.randn(6), torch.randn(6)
    _, got = evaluate(lambda t, ww, bb: F.layer_norm(t, ww, bb, eps=1e-5), X, w, b)
    close(got, torch.nn.functional.layer_norm(X, (6,), w, b, 1e-5))
    _, got = evaluate(lambda t, ww: F.rms_norm(t, ww, eps=1e-6), X, w)
    close(got, X / torch.sqrt(X.pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    outs, (normed, total) = evaluate(lambda t, r, ww: F.fused_add_rms_norm(t, r, ww, eps=1e-6), X, Y, w)
    assert outs[0].shape == outs[1].shape == (-1, 6)
    close(total, X + Y)
    close(normed, (X + Y) / torch.sqrt((X + Y).pow(2).mean(-1, keepdim=True) + 1e-6) * w)
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [2, 6])
        with pytest.raises(ValueError, match=r"rms_norm: .* has shape \[5\], expected \[6\]"):
            F.rms_norm(x, F.constant(torch.ones(5)))


def test_gated_activations():
    x = torch.randn(3, 8)
    out, got = evaluate(F.silu_and_mul, x)
    assert out.shape == (-1, 4)
    close(got, torch.nn.functional.silu(x[:, :4]) * x[:, 4:])
    _, got = evaluate(lambda t: F.gelu_and_mul(t, approximate="tanh"), x)
    close(got, torch.nn.functional.gelu(x[:, :4], approximate="tanh") * x[:, 4:])


def test_norm_and_activation_fused_with_a_linear():
    w, weight, bias = torch.rand(6) + 0.5, torch.randn(4, 6), torch.randn(4)
    normed = X / torch.sqrt(X.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    const = F.constant  # static weights: evaluate() makes every input's first dim dynamic
    out, got = evaluate(lambda t, ww: F.rms_norm_linear(t, ww, const(weight), const(bias), eps=1e-6), X, w)
    assert out.shape == (-1, 4)
    close(got, normed @ weight.T + bias)
    outs, (y, total) = evaluate(lambda t, r, ww: F.add_rms_norm_linear(t, r, ww, const(weight), eps=1e-6), X, Y, w)
    assert outs[0].shape == (-1, 4) and outs[1].shape == (-1, 6)
    close(total, X + Y)
    close(y, ((X + Y) / torch.sqrt((X + Y).pow(2).mean(-1, keepdim=True) + 1e-6) * w) @ weight.T)
    x2, down = torch.randn(5, 8), torch.randn(3, 4)
    out, got = evaluate(lambda t: F.silu_and_mul_linear(t, const(down), const(bias[:3])), x2)
    assert out.shape == (-1, 3)
    close(got, (torch.nn.functional.silu(x2[:, :4]) * x2[:, 4:]) @ down.T + bias[:3])

    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, 6], [DYN])
        ones6, m = F.constant(torch.ones(6)), F.constant(torch.zeros(4, 6))
        with pytest.raises(ValueError, match=r"rms_norm_linear: norm_weight has shape \[5\], expected \[6\]"):
            F.rms_norm_linear(x, F.constant(torch.ones(5)), m, eps=1e-6)
        with pytest.raises(ValueError, match=r"rms_norm_linear: input \[-1, 6\] does not match weight "
                                             r"\[out, in\] \[6, 4\]"):
            F.rms_norm_linear(x, ones6, F.constant(torch.zeros(6, 4)), eps=1e-6)
        with pytest.raises(ValueError, match=r"rms_norm_linear: bias has shape \[3\], expected \[4\]"):
            F.rms_norm_linear(x, ones6, m, F.constant(torch.zeros(3)), eps=1e-6)
        with pytest.raises(ValueError, match=r"add_rms_norm_linear: x \[-1, 6\] and residual \[2, 5\] differ"):
            F.add_rms_norm_linear(x, F.constant(torch.zeros(2, 5)), ones6, m, eps=1e-6)
        with pytest.raises(ValueError, match="add_rms_norm_linear: dtype mismatch"):
            F.add_rms_norm_linear(x, x, ones6, F.constant(torch.zeros(4, 6, dtype=torch.bfloat16)), eps=1e-6)
        with pytest.raises(ValueError, match=r"silu_and_mul_linear: input \[-1, 6\] gated to \[-1, 3\] does not "
                                             r"match weight \[out, in\] \[4, 6\]"):
            F.silu_and_mul_linear(x, m)
        with pytest.raises(ValueError, match=r"silu_and_mul_linear: last dim must be even"):
            F.silu_and_mul_linear(F.slice(x, 1, 0, 5), m)


@pytest.mark.parametrize("eps", [-1.0, math.nan, math.inf])
def test_every_norm_refuses_an_eps_no_kernel_takes(eps):
    """Each op with a norm records a finite eps >= 0 or refuses it (an engine file that says
    otherwise is refused at load by the replay of its ops, not inside a kernel)."""
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, 6], [DYN])
        ones6, m = F.constant(torch.ones(6)), F.constant(torch.zeros(4, 6))
        calls = {"layer_norm": lambda: F.layer_norm(x, ones6, eps=eps),
                 "rms_norm": lambda: F.rms_norm(x, ones6, eps=eps),
                 "fused_add_rms_norm": lambda: F.fused_add_rms_norm(x, x, ones6, eps=eps),
                 "rms_norm_linear": lambda: F.rms_norm_linear(x, ones6, m, eps=eps),
                 "add_rms_norm_linear": lambda: F.add_rms_norm_linear(x, x, ones6, m, eps=eps)}
        for op, call in calls.items():
            with pytest.raises(ValueError, match=rf"{op}: eps must be finite and >= 0"):
                call()
        F.rms_norm(x, ones6, eps=0)  # zero is an eps the kernels take


def test_embedding_gather_index_select_argmax_cast_where():
    table, ids = torch.randn(10, 4), torch.tensor([3, 0, 9], dtype=torch.int32)
    out, got = evaluate(lambda i, t: F.embedding(i, t), ids, table)
    assert out.shape == (-1, 4)
    close(got, table[ids.long()])
    idx = torch.randint(0, 6, (5, 2))
    _, got = evaluate(lambda t, i: F.gather(t, 1, i), X, idx)
    close(got, torch.gather(X, 1, idx))
    rows = torch.tensor([4, 0], dtype=torch.int64)
    out, got = evaluate(lambda t, i: F.index_select(t, 0, i), X, rows)
    close(got, X[rows])
    _, got = evaluate(lambda t, i: F.index_select(t, 0, i, increasing=True), X, torch.tensor([1, 3]))
    close(got, X[[1, 3]])
    out, got = evaluate(lambda t: F.argmax(t, -1, keepdim=True), X)
    assert out.dtype == "int64" and out.shape == (-1, 1)
    assert torch.equal(got, X.argmax(-1, keepdim=True))
    out, got = evaluate(lambda t: F.cast(t, torch.float16), X)
    assert out.dtype == "float16" and got.dtype == torch.float16
    cond = X > 0
    _, got = evaluate(F.where, cond, X, Y)
    close(got, torch.where(cond, X, Y))
    _, got = evaluate(lambda c, a: F.where(c, a, 0.0), cond, X)
    close(got, torch.where(cond, X, 0.0))


def test_shape_ops():
    x = torch.randn(4, 6, 8)
    out, got = evaluate(lambda t: F.concat([t, t * 2], dim=2), x)
    assert out.shape == (-1, 6, 16)
    close(got, torch.cat([x, x * 2], 2))
    outs, got = evaluate(lambda t: F.split(t, [2, 6], dim=-1), x)
    assert [o.shape for o in outs] == [(-1, 6, 2), (-1, 6, 6)]
    close(got[0], x[..., :2])
    close(got[1], x[..., 2:])
    outs, got = evaluate(lambda t: t.split(3, dim=1), x)
    assert len(outs) == 2 and outs[0].shape == (-1, 3, 8)
    out, got = evaluate(lambda t: F.slice(t, 1, 1, 4), x)
    assert out.shape == (-1, 3, 8)
    close(got, x[:, 1:4])
    out, got = evaluate(lambda t: F.slice(t, 2, -3), x)
    assert out.shape == (-1, 6, 3)
    close(got, x[:, :, -3:])
    out, got = evaluate(lambda t: F.view(t, [0, -1, 4]), x)
    assert out.shape == (-1, -1, 4)
    close(got, x.reshape(4, 12, 4))
    out, got = evaluate(lambda t: t.view([0, 48]), x)
    close(got, x.reshape(4, 48))
    out, got = evaluate(lambda t: F.transpose(t, 0, 2), x)
    assert out.shape == (8, 6, -1)
    close(got, x.transpose(0, 2))
    out, got = evaluate(lambda t: F.permute(t, [2, 0, 1]), x)
    assert out.shape == (8, -1, 6)
    close(got, x.permute(2, 0, 1))
    out, got = evaluate(lambda t: F.squeeze(F.unsqueeze(t, -1), 3), x)
    assert out.shape == (-1, 6, 8)
    close(got, x)


def test_static_view_inference_and_errors():
    net = Network()
    with net_guard(net):
        x = net.add_input("x", "float32", [4, 6])
        assert F.view(x, [-1, 3]).shape == (8, 3)
        assert F.view(x, [2, 0, -1]).shape == (2, 6, 2)
        with pytest.raises(ValueError, match="view: cannot view"):
            F.view(x, [5, -1])
        with pytest.raises(ValueError, match="squeeze: dim 0"):
            F.squeeze(x, 0)
        with pytest.raises(ValueError, match="split: sizes"):
            F.split(x, [1, 2], 1)
        with pytest.raises(ValueError, match="concat: shapes"):
            F.concat([x, F.transpose(x, 0, 1)], 0)


def test_allreduce_is_identity_at_world_size_one():
    _, got = evaluate(F.allreduce, X)
    close(got, X)


def test_rotary_embedding_and_attention_ops_infer_shapes():
    net = Network()
    with net_guard(net):
        qkv = net.add_input("qkv", "float16", [-1, 9 * 64 + 2 * 3 * 64], [DYN])
        pos = net.add_input("position_ids", "int32", [-1], [DYN])
        q, k, v = F.split(qkv, [576, 192, 192], dim=-1)
        cache = F.constant(F.rope_cos_sin_cache(128, 64))
        q = F.rotary_embedding(q, pos, cache, num_heads=9, head_dim=64, rotary_dim=64, is_neox=True)
        pool = net.add_input("kv_cache_pool", "float16", [30, -1, 2, 3, 32, 64], [("blocks", (1, 8, 64))])
        tables = net.add_input("block_tables", "int32", [-1, -1], [("b", (1, 2, 4)), ("m", (1, 2, 8))])
        lens = [net.add_input(n, "int32", [-1], [("b", (1, 2, 4))])
                for n in ("sequence_lengths", "context_lengths", "host_context_lengths")]
        out = F.gpt_attention(q, k, v, pool, tables, *lens, layer_idx=3, num_heads=9, num_kv_heads=3, head_dim=64,
                              tokens_per_block=32)
        assert out.shape == (-1, 576) and out.dtype == "float16"
        with pytest.raises(ValueError, match="gpt_attention: num_heads 9 is not a multiple of num_kv_heads 2"):
            F.gpt_attention(q, k, v, pool, tables, *lens, layer_idx=0, num_heads=9, num_kv_heads=2, head_dim=64,
                            tokens_per_block=32)
        with pytest.raises(ValueError, match=r"gpt_attention: k has shape \[-1, 192\], expected \[-1, 576\]"):
            F.gpt_attention(q, k, v, pool, tables, *lens, layer_idx=0, num_heads=9, num_kv_heads=9, head_dim=64,
                            tokens_per_block=32)
        with pytest.raises(ValueError, match="rotary_embedding: cos_sin_cache must be float32"):
            F.rotary_embedding(q, pos, F.cast(cache, "float16"), num_heads=9, head_dim=64)


def test_rotary_embedding_through_executor():
    x = torch.randn(4, 2 * 8)
    pos = torch.tensor([0, 5, 2, 9], dtype=torch.int32)
    table = F.rope_cos_sin_cache(16, 8)

    def build(t, p):
        return F.rotary_embedding(t, p, F.constant(table), num_heads=2, head_dim=8, rotary_dim=8, is_neox=True)

    _, got = evaluate(build, x, pos)
    heads = x.view(4, 2, 8)
    inv = 1.0 / (10000 ** (torch.arange(0, 8, 2).double() / 8))
    ang = pos.double()[:, None, None] * inv
    x1, x2 = heads[..., :4].double(), heads[..., 4:].double()
    ref = torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], -1)
    close(got.double(), ref.flatten(1))


def test_tensor_graph_api():
    net = Network()
    with net_guard(net):
        x = Tensor(name="x", dtype="float32", shape=[-1, 4], dim_range=[DYN])
        assert x.is_input() and x.dim_range == {0: DYN}
        w = F.constant(torch.randn(3, 4))
        y = F.linear(x, w)
        a, b = F.relu(y), F.tanh(y)
        net.mark_output(a + b, "out")
    assert y.get_parent().op == "linear" and x.get_parent() is None
    assert sorted(layer.op for layer in y.get_users()) == ["relu", "tanh"]
    with net_guard(net):
        y2 = F.linear(x, w)
    y.replace_all_uses_with(y2)
    assert y.get_users() == [] and len(y2.get_users()) == 2
    assert a.get_parent().inputs == (y2.name,)
    with net_guard(net), pytest.raises(ValueError, match="replace_all_uses_with.*float32.*float16"):
        y2.replace_all_uses_with(F.cast(y2, "float16"))


def test_ops_need_an_active_network_and_the_same_network():
    net1, net2 = Network("one"), Network("two")
    with net_guard(net1):
        x = net1.add_input("x", "float32", [2])
    with pytest.raises(RuntimeError, match="net_guard"):
        F.relu(x)
    with net_guard(net2):
        with pytest.raises(ValueError, match="belongs to network 'one'"):
            F.relu(x)


def test_rope_cache_rejects_unknown_scaling():
    with pytest.raises(ValueError, match="yarn"):
        F.rope_cos_sin_cache(8, 4, scaling={"type": "yarn", "factor": 2.0})
    assert math.isclose(float(F.rope_cos_sin_cache(4, 4)[3, 0]), math.cos(3.0), rel_tol=1e-6)


def test_index_select_of_every_row_in_order_is_its_input_uncopied():
    """increasing=True and an index as long as the dim: x itself (a decode step's gather of
    its rows' logits); any other length gathers; no index reads outside x either way."""
    impl = OPS["index_select"].impls_on(torch.device("cpu"))["reference"]
    x = torch.randn(4, 3)
    assert impl(x, torch.arange(4), dim=0, increasing=True) is x
    assert torch.equal(impl(x, torch.tensor([0, 2]), dim=0, increasing=True), x[[0, 2]])
    assert torch.equal(impl(x, torch.tensor([3, 2, 1, 0]), dim=0), x.flip(0))  # no promise: a gather
    with pytest.raises(ValueError, match="index_select: increasing must be a bool"):
        with net_guard(Network()):
            F.index_select(default_net().add_input("x", "float32", [4, 3]), 0,
                           default_net().add_input("i", "int64", [2]), increasing=1)
