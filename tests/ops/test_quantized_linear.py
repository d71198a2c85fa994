"""weight_only_linear: the shape rule, the reference (= quantized_linear_reference, the
meaning), and the CPU implementation (torch's INT8 / INT4 kernels) against the reference on
random data; the CPU runtime chooses the CPU implementation."""
import pytest
import torch

from tensorrt_llm import functional as F
from tensorrt_llm.network import Network, net_guard
from tensorrt_llm.ops import CPU, OPS, implementations
from tensorrt_llm.ops.quantized_linear import cpu_pack, weight_only_linear_cpu, weight_only_linear_reference
from tensorrt_llm.quantization import dequantize, quantize_int4, quantize_int8, quantized_linear_reference
from tensorrt_llm.runtime.session import Session

OP = OPS["weight_only_linear"]


def _weight(fmt, n, k, group, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    if fmt == "int8":
        q = quantize_int8(w, group or None)
        return q, (q.qweight, q.scales, None)
    q = quantize_int4(w, group)
    return q, (q.qweight, q.scales, q.zeros)


CASES = [("int8", 0), ("int8", 32), ("int8", 16), ("int4", 32), ("int4", 64), ("int4", 128)]


@pytest.mark.parametrize("fmt,group", CASES)
def test_reference_is_the_formats_meaning(fmt, group):
    q, (qw, s, z) = _weight(fmt, 40, 256, group)
    x = torch.randn(3, 256)
    bias = torch.randn(40)
    got = weight_only_linear_reference(x, qw, s, z, bias, weight_format=fmt, group_size=group)
    torch.testing.assert_close(got, quantized_linear_reference(x, q, bias), rtol=0, atol=0)
    # and that is x @ W^T with the dequantized weight
    torch.testing.assert_close(got, x @ dequantize(q).t() + bias, rtol=1e-5, atol=1e-5)


# The CPU kernels round x, the scales and zeros to bfloat16 and the output to bfloat16 (8 bits
# of mantissa): a relative error of a few 2^-9 per output, so 2% of the output's largest
# magnitude bounds it with room (quantization/cpu.py). Group 16 INT8 is requantized per row.
@pytest.mark.parametrize("fmt,group", CASES)
@pytest.mark.parametrize("rows", [1, 7])
@pytest.mark.parametrize("n", [40, 64])  # 40: not a multiple of 16 (padded in the pack)
def test_cpu_matches_reference(fmt, group, rows, n):
    q, (qw, s, z) = _weight(fmt, n, 256, group, seed=rows + n)
    x = torch.randn(2, rows, 256)
    bias = torch.randn(n)
    want = weight_only_linear_reference(x, qw, s, z, bias, weight_format=fmt, group_size=group)
    got = weight_only_linear_cpu(x, qw, s, z, bias, weight_format=fmt, group_size=group)
    assert got.shape == want.shape == (2, rows, n) and got.dtype == torch.float32
    tol = (0.03 if group == 16 else 0.02) * want.abs().max().item()
    assert (got - want).abs().max().item() <= tol


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_keeps_half_activations(dtype):
    _, (qw, s, z) = _weight("int4", 32, 128, 64)
    x = torch.randn(3, 128, dtype=dtype)
    got = weight_only_linear_cpu(x, qw, s, z, weight_format="int4", group_size=64)
    want = weight_only_linear_reference(x.float(), qw, s, z, weight_format="int4", group_size=64)
    assert got.dtype == dtype
    assert (got.float() - want).abs().max() <= 0.03 * want.abs().max()


def test_cpu_pack_is_made_once_per_weight_and_redone_after_an_edit():
    _, (qw, s, z) = _weight("int4", 32, 128, 32)
    first = cpu_pack(qw, s, z, "int4", 32)
    assert cpu_pack(qw, s, z, "int4", 32) is first
    qw.add_(0)  # an in-place write (a refit) bumps the version
    assert cpu_pack(qw, s, z, "int4", 32) is not first


def _network(fmt, group, n=48, k=128):
    _, (qw, s, z) = _weight(fmt, n, k, group)
    net = Network("q")
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, k], {0: ("rows", (1, 4, 8))})
        y = F.weight_only_linear(x, F.constant(qw, name="w"), F.constant(s, name="w_scale"),
                                 None if z is None else F.constant(z, name="w_zero"),
                                 weight_format=fmt, group_size=group)
        net.mark_output(y, "y")
    return net, (qw, s, z)


@pytest.mark.parametrize("fmt,group", [("int8", 0), ("int4", 32)])
def test_the_cpu_runtime_chooses_the_cpu_implementation(fmt, group):
    assert list(implementations("cpu")["weight_only_linear"])[0] == CPU
    net, (qw, s, z) = _network(fmt, group)
    session = Session(net, device="cpu")
    x = torch.randn(5, 128)
    y = session.run({"x": x})["y"]
    assert torch.equal(y, weight_only_linear_cpu(x, qw, s, z, weight_format=fmt, group_size=group))


def test_shape_rule():
    net, _ = _network("int4", 32)
    assert net.get_tensor("y").shape == (-1, 48) and net.get_tensor("y").dtype == "float32"
    qw8 = torch.zeros(16, 64, dtype=torch.int8)
    qw4 = torch.zeros(16, 32, dtype=torch.uint8)
    s = torch.ones(16, 2)
    bad = [
        (dict(qweight=qw4, scales=torch.ones(16), weight_format="int8"), "int8"),
        (dict(qweight=qw8, scales=torch.ones(16, 3), weight_format="int8", group_size=32), "scales"),
        (dict(qweight=qw8, scales=torch.ones(16), zeros=torch.ones(16), weight_format="int8"), "zeros"),
        (dict(qweight=qw4, scales=s, weight_format="int4", group_size=32), "zeros"),
        (dict(qweight=qw4, scales=s, zeros=s.half(), weight_format="int4", group_size=32), "zeros"),
        (dict(qweight=qw4, scales=torch.ones(16, 1), zeros=torch.ones(16, 1), weight_format="int4",
              group_size=64), "x"),
        (dict(qweight=qw4, scales=s, zeros=s, weight_format="int4", group_size=48), "group size"),
        (dict(qweight=qw8, scales=torch.ones(16), weight_format="int2"), "weight_format"),
    ]
    for kwargs, what in bad:
        n = Network("bad")
        with net_guard(n):
            k = 64
            x = n.add_input("x", "float32", [2, 64 if what != "x" else 32])
            args = {key: F.constant(v, name=key) if isinstance(v, torch.Tensor) else v for key, v in kwargs.items()}
            with pytest.raises(ValueError, match="weight_only_linear"):
                OP(x, **args)
            del k


# ---- the norm / activation fused in front: rms_norm_weight_only_linear and family --------------

from tensorrt_llm.ops.activation import silu_and_mul_cuda, silu_and_mul_reference  # noqa: E402
from tensorrt_llm.ops.norm import (  # noqa: E402
    fused_add_rms_norm_cuda,
    fused_add_rms_norm_reference,
    rms_norm_cuda,
    rms_norm_reference,
)
from tensorrt_llm.ops.quantized_linear import (  # noqa: E402
    add_rms_norm_weight_only_linear_cpu,
    add_rms_norm_weight_only_linear_cuda,
    add_rms_norm_weight_only_linear_reference,
    rms_norm_weight_only_linear_cpu,
    rms_norm_weight_only_linear_cuda,
    rms_norm_weight_only_linear_reference,
    silu_and_mul_weight_only_linear_cpu,
    silu_and_mul_weight_only_linear_cuda,
    silu_and_mul_weight_only_linear_reference,
    weight_only_gemv_prologue_serves,
    weight_only_linear_cuda,
)


@pytest.mark.parametrize("fmt,group", [("int8", 0), ("int4", 32)])
def test_fused_ops_are_the_two_ops_one_after_the_other(fmt, group):
    """The references compose rms_norm / fused_add_rms_norm / silu_and_mul with the linear; the
    CPU implementations compose the same norms with the CPU linear (bit for bit)."""
    _, (qw, s, z) = _weight(fmt, 40, 64, group)
    g = torch.Generator().manual_seed(5)
    x, r, wide = torch.randn(3, 64, generator=g), torch.randn(3, 64, generator=g), torch.randn(3, 128, generator=g)
    norm_weight = torch.rand(64, generator=g) + 0.5
    kw = dict(weight_format=fmt, group_size=group)
    normed = rms_norm_reference(x, norm_weight, eps=1e-6)
    assert torch.equal(rms_norm_weight_only_linear_reference(x, norm_weight, qw, s, z, eps=1e-6, **kw),
                       weight_only_linear_reference(normed, qw, s, z, **kw))
    assert torch.equal(rms_norm_weight_only_linear_cpu(x, norm_weight, qw, s, z, eps=1e-6, **kw),
                       weight_only_linear_cpu(normed, qw, s, z, **kw))
    summed, total = fused_add_rms_norm_reference(x, r, norm_weight, eps=1e-6)
    for impl, linear in ((add_rms_norm_weight_only_linear_reference, weight_only_linear_reference),
                         (add_rms_norm_weight_only_linear_cpu, weight_only_linear_cpu)):
        y, t = impl(x, r, norm_weight, qw, s, z, eps=1e-6, **kw)
        assert torch.equal(t, x + r) and torch.equal(y, linear(summed, qw, s, z, **kw))
    gated = silu_and_mul_reference(wide)
    assert torch.equal(silu_and_mul_weight_only_linear_reference(wide, qw, s, z, **kw),
                       weight_only_linear_reference(gated, qw, s, z, **kw))
    assert torch.equal(silu_and_mul_weight_only_linear_cpu(wide, qw, s, z, **kw),
                       weight_only_linear_cpu(gated, qw, s, z, **kw))


def test_fused_ops_shape_rules():
    _, (qw, s, z) = _weight("int4", 48, 64, 32)
    with net_guard(Network("n")):
        x = F.constant(torch.zeros(2, 64))
        q, sc, zz = F.constant(qw), F.constant(s), F.constant(z)
        kw = dict(weight_format="int4", group_size=32)
        assert F.rms_norm_weight_only_linear(x, F.constant(torch.ones(64)), q, sc, zz, eps=1e-6, **kw).shape == (2, 48)
        y, total = F.add_rms_norm_weight_only_linear(x, x, F.constant(torch.ones(64)), q, sc, zz, eps=1e-6, **kw)
        assert y.shape == (2, 48) and total.shape == (2, 64)
        assert F.silu_and_mul_weight_only_linear(F.constant(torch.zeros(2, 128)), q, sc, zz, **kw).shape == (2, 48)
        with pytest.raises(ValueError, match=r"norm_weight has shape \[32\], expected \[64\]"):
            F.rms_norm_weight_only_linear(x, F.constant(torch.ones(32)), q, sc, zz, eps=1e-6, **kw)
        with pytest.raises(ValueError, match="silu_and_mul_weight_only_linear: input"):
            F.silu_and_mul_weight_only_linear(x, q, sc, zz, **kw)  # x [2, 64] gated to 32 inputs, not 64
        with pytest.raises(ValueError, match="add_rms_norm_weight_only_linear: INT4 group size 48"):
            F.add_rms_norm_weight_only_linear(x, x, F.constant(torch.ones(64)), q, sc, zz, eps=1e-6,
                                              weight_format="int4", group_size=48)


# ---- GPU: the pipelined weight-only GEMV with its input's op in front ---------------------------

def _gpu_case(m, k, n, fmt, group, dtype, prologue, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    q = quantize_int8(w, group or None) if fmt == "int8" else quantize_int4(w, group)
    qw, s = q.qweight.cuda(), q.scales.cuda()
    z = q.zeros.cuda() if fmt == "int4" else None
    width = 2 * k if prologue == "silu_and_mul" else k
    x = torch.randn(m, width, generator=g).to(dtype).cuda()
    residual = torch.randn(m, k, generator=g).to(dtype).cuda()
    norm_weight = (torch.rand(k, generator=g) + 0.5).to(dtype).cuda()
    bias = torch.randn(n, generator=g).to(dtype).cuda() if seed % 2 else None
    return x, residual, norm_weight, (qw, s, z), bias


# LLaMA-3-8B's qkv, gate_up and down at INT4 group 128 and INT8 per channel; a small odd n.
FUSED_SHAPES = [(4096, 6144), (4096, 28672), (1024, 40)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt,group", [("int4", 128), ("int8", 0)])
@pytest.mark.parametrize("k,n", FUSED_SHAPES)
@pytest.mark.parametrize("m", [1, 2, 8])
def test_rms_norm_prologue_is_the_rms_norm_kernel_then_the_gemv(m, k, n, fmt, group, dtype):
    """The fused GEMV rounds x as the rms_norm kernel does, then runs the same pipelined kernel:
    the unfused CUDA ops' numbers bit for bit (the sum of squares in another block's order can
    flip an x rounding: none seen), and the sum written as the fused_add_rms_norm kernel writes it."""
    x, residual, norm_weight, (qw, s, z), bias = _gpu_case(m, k, n, fmt, group, dtype, "rms_norm", m + n)
    kw = dict(weight_format=fmt, group_size=group)
    assert weight_only_gemv_prologue_serves("rms_norm", x, qw, s, fmt, group, norm_weight, residual)
    got = rms_norm_weight_only_linear_cuda(x, norm_weight, qw, s, z, bias, eps=1e-5, **kw)
    want = weight_only_linear_cuda(rms_norm_cuda(x, norm_weight, eps=1e-5), qw, s, z, bias, **kw)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    y, total = add_rms_norm_weight_only_linear_cuda(x, residual, norm_weight, qw, s, z, bias, eps=1e-5, **kw)
    normed, want_total = fused_add_rms_norm_cuda(x, residual, norm_weight, eps=1e-5)
    assert torch.equal(total, want_total)
    torch.testing.assert_close(y, weight_only_linear_cuda(normed, qw, s, z, bias, **kw), rtol=0, atol=0)
    ref, _ = add_rms_norm_weight_only_linear_reference(x.float(), residual.float(), norm_weight.float(),
                                                       qw, s, z, None if bias is None else bias.float(), eps=1e-5, **kw)
    assert (y.float() - ref).norm() <= 0.02 * ref.norm()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt,group", [("int4", 128), ("int8", 0)])
@pytest.mark.parametrize("m,k,n", [(1, 14336, 4096), (2, 14336, 4096), (8, 4096, 1000), (1, 1024, 40)])
def test_silu_and_mul_prologue_is_the_activation_kernel_then_the_gemv(m, k, n, fmt, group, dtype):
    x, _, _, (qw, s, z), bias = _gpu_case(m, k, n, fmt, group, dtype, "silu_and_mul", m + n + 1)
    kw = dict(weight_format=fmt, group_size=group)
    assert weight_only_gemv_prologue_serves("silu_and_mul", x, qw, s, fmt, group, bias)
    got = silu_and_mul_weight_only_linear_cuda(x, qw, s, z, bias, **kw)
    torch.testing.assert_close(got, weight_only_linear_cuda(silu_and_mul_cuda(x), qw, s, z, bias, **kw), rtol=0, atol=0)


@pytest.mark.gpu
def test_prologue_dispatch_and_fallbacks():
    """Calls the fused kernel does not serve run the unfused CUDA ops, with their numbers."""
    x, residual, norm_weight, (qw, s, z), bias = _gpu_case(9, 4096, 256, "int4", 128, torch.bfloat16, "rms_norm", 3)
    kw = dict(weight_format="int4", group_size=128)
    assert not weight_only_gemv_prologue_serves("rms_norm", x, qw, s, "int4", 128, norm_weight)  # 9 rows
    assert weight_only_gemv_prologue_serves("rms_norm", x[:8], qw, s, "int4", 128, norm_weight)
    assert not weight_only_gemv_prologue_serves("rms_norm", x[:8], qw, s, "int4", 128, norm_weight[1:])  # unaligned
    assert not weight_only_gemv_prologue_serves("rms_norm", x[:2].float(), qw, s, "int4", 128)  # float32 x
    wide = torch.randn(3, 2 * 14336, device="cuda", dtype=torch.bfloat16)  # 3 rows of 14,336: over 64 KB
    _, _, _, (qd, sd, zd), _ = _gpu_case(1, 14336, 64, "int4", 128, torch.bfloat16, "silu_and_mul", 4)
    assert not weight_only_gemv_prologue_serves("silu_and_mul", wide, qd, sd, "int4", 128)
    torch.testing.assert_close(silu_and_mul_weight_only_linear_cuda(wide, qd, sd, zd, **kw),
                               weight_only_linear_cuda(silu_and_mul_cuda(wide), qd, sd, zd, **kw), rtol=0, atol=0)
    _, _, _, (q64, s64, z64), _ = _gpu_case(1, 4096, 64, "int4", 64, torch.bfloat16, "rms_norm", 5)
    assert not weight_only_gemv_prologue_serves("rms_norm", x[:1], q64, s64, "int4", 64)  # groups of half a k-step
    y, total = add_rms_norm_weight_only_linear_cuda(x, residual, norm_weight, qw, s, z, bias, eps=1e-5, **kw)
    normed, want_total = fused_add_rms_norm_cuda(x, residual, norm_weight, eps=1e-5)
    assert torch.equal(total, want_total)
    torch.testing.assert_close(y, weight_only_linear_cuda(normed, qw, s, z, bias, **kw), rtol=0, atol=0)


@pytest.mark.gpu
def test_prologue_replays_in_a_cuda_graph():
    x, residual, norm_weight, (qw, s, z), bias = _gpu_case(1, 4096, 6144, "int4", 128, torch.bfloat16, "rms_norm", 7)
    kw = dict(weight_format="int4", group_size=128)
    add_rms_norm_weight_only_linear_cuda(x, residual, norm_weight, qw, s, z, bias, eps=1e-5, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, total = add_rms_norm_weight_only_linear_cuda(x, residual, norm_weight, qw, s, z, bias, eps=1e-5, **kw)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    normed, want_total = fused_add_rms_norm_cuda(x, residual, norm_weight, eps=1e-5)
    assert torch.equal(total, want_total)
    torch.testing.assert_close(y, weight_only_linear_cuda(normed, qw, s, z, bias, **kw), rtol=0, atol=0)
