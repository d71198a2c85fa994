"""weight_only_linear: the shape rule, the reference (= quantized_linear_reference, the
meaning), and the CPU implementation (torch's INT8 / INT4 kernels) against the reference on
random data; the CPU runtime chooses the CPU implementation."""
import pytest
import torch

from tensorrt_llm import functional as F
from tensorrt_llm.graph_rewriting import tile_weight_only_codes, tiled_code_weights
from tensorrt_llm.network import Network, net_guard
from tensorrt_llm.ops import CPU, OPS, implementations
from tensorrt_llm.ops.quantized_linear import (
    cpu_pack,
    gated_epilogue_takes,
    gated_gemv_serves,
    pipelined_groups,
    pipelined_takes_x,
    tile_codes,
    tileable,
    untile_codes,
    weight_only_linear_cpu,
    weight_only_linear_reference,
)
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
        (dict(qweight=qw8[:, :48], scales=torch.ones(16), weight_format="int8", tiled=True), "no tile order"),
        (dict(qweight=qw8, scales=torch.ones(16), weight_format="int8", tiled=1), "tiled must be"),
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


# ---- tile order ----


def test_the_pipelined_gemvs_limits():
    """What the fused forms of the pipelined GEMV (gated, the norm in front) take, as the
    bindings check it: up to 8 rows of half-precision x within 64 KB on 16-byte boundaries;
    float32 scales in groups of whole k-steps; gated, out_features a multiple of 16."""
    x = torch.zeros(8, 4096, dtype=torch.bfloat16)
    assert pipelined_takes_x(x) and pipelined_takes_x(x.half())
    assert not pipelined_takes_x(torch.zeros(9, 256, dtype=torch.bfloat16))        # rows
    assert not pipelined_takes_x(torch.zeros(4, 16384, dtype=torch.bfloat16))      # 128 KB
    assert not pipelined_takes_x(x.float())                                        # dtype
    assert not pipelined_takes_x(torch.zeros(2, 4104, dtype=torch.bfloat16)[:, 4:4100])  # 8 bytes past a boundary
    assert not pipelined_takes_x(torch.zeros(2, 4100, dtype=torch.bfloat16)[:, :4096])  # rows 8,200 bytes apart
    assert pipelined_takes_x(torch.zeros(2, 4104, dtype=torch.bfloat16)[:, 8:])  # 16-byte steps
    f32 = torch.zeros(1, dtype=torch.float32)
    assert pipelined_groups(f32, "int4", 128) and pipelined_groups(f32, "int8", 0)
    assert not pipelined_groups(f32, "int4", 64)                                   # less than a k-step
    assert not pipelined_groups(f32.half(), "int4", 128)
    assert gated_epilogue_takes(x, 32) and not gated_epilogue_takes(x, 24)
    assert gated_gemv_serves(x, 32, f32, "int4", 128) and not gated_gemv_serves(x, 32, f32, "int4", 64)


def test_tile_order_puts_each_pack_where_the_kernels_read_it():
    # Pack p (16 bytes) of row r goes to (((r // 16) * steps + p // 4) * 2 + r % 16 // 8) * 32
    # + (r % 8) * 4 + p % 4 (packIndex in cpp/kernels/weight_only_gemv.cuh), steps = packs // 4.
    n, packs = 48, 8
    codes = torch.randint(0, 256, (n, 16 * packs), dtype=torch.uint8)
    tiled = tile_codes(codes)
    assert tiled.shape == codes.shape and tiled.dtype == codes.dtype
    flat = tiled.view(-1, 16)
    steps = packs // 4
    for r in range(n):
        for p in range(packs):
            at = (((r // 16) * steps + p // 4) * 2 + r % 16 // 8) * 32 + (r % 8) * 4 + p % 4
            assert torch.equal(flat[at], codes[r, 16 * p:16 * (p + 1)])
    assert torch.equal(untile_codes(tiled), codes)
    signed = codes.view(torch.int8)
    assert torch.equal(untile_codes(tile_codes(signed)), signed) and tile_codes(signed).dtype == torch.int8


def test_tile_order_needs_whole_tiles_and_k_steps():
    assert tileable(16, 64) and tileable(4096, 2048)
    assert not tileable(40, 64) and not tileable(16, 96)
    with pytest.raises(ValueError, match="no tile order"):
        tile_codes(torch.zeros(40, 64, dtype=torch.uint8))


@pytest.mark.parametrize("fmt,group", CASES)
def test_codes_in_tile_order_give_row_orders_outputs(fmt, group):
    # The reference and the CPU kernels read tile order as row order: the same bits.
    _, (qw, s, z) = _weight(fmt, 48, 256, group)
    x = torch.randn(5, 256)
    for impl in (weight_only_linear_reference, weight_only_linear_cpu):
        want = impl(x, qw, s, z, weight_format=fmt, group_size=group)
        got = impl(x, tile_codes(qw), s, z, weight_format=fmt, group_size=group, tiled=True)
        assert torch.equal(got, want), impl.__name__


@pytest.mark.parametrize("fmt,group", [("int8", 0), ("int4", 32)])
def test_tile_weight_only_codes_reorders_a_network_in_place(fmt, group):
    net, (qw, s, z) = _network(fmt, group)
    x = torch.randn(5, 128)
    before = Session(net, device="cpu").run({"x": x})["y"]
    assert tiled_code_weights(net) == set()
    assert tile_weight_only_codes(net) == 1
    layer = next(layer for layer in net.layers if layer.op == "weight_only_linear")
    assert layer.attrs["tiled"] is True
    assert torch.equal(net.weights["w"], tile_codes(qw)) and tiled_code_weights(net) == {"w"}
    assert tile_weight_only_codes(net) == 0  # already in tile order
    assert torch.equal(Session(net, device="cpu").run({"x": x})["y"], before)
    # the layer's attribute travels with the graph
    assert Network.from_dict(net.to_dict(), net.weights).layers[-1].attrs.get("tiled") is True


def test_tile_weight_only_codes_leaves_shapes_without_a_tile_order():
    net, (qw, _, _) = _network("int8", 0, n=40)  # 40 rows: no whole tiles
    assert tile_weight_only_codes(net) == 0
    assert torch.equal(net.weights["w"], qw)


# ---- gated: silu_and_mul of the product (graph_rewriting's fuse_gated_linear) ----


@pytest.mark.parametrize("fmt,group", [("int8", 0), ("int4", 32)])
def test_gated_is_silu_and_mul_of_the_product(fmt, group):
    """Reference and CPU implementation (host GEMV rows and torch's prompt path): silu_and_mul of
    the ungated output as that device computes it (the reference's, the CPU's), bit for bit; the
    shape is [..., N / 2]."""
    from tensorrt_llm.ops.activation import silu_and_mul_cpu, silu_and_mul_reference
    _, (qw, s, z) = _weight(fmt, 64, 256, group)
    for rows in (1, 3, 40):
        x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
        kw = dict(weight_format=fmt, group_size=group)
        for impl, act in ((weight_only_linear_reference, silu_and_mul_reference),
                          (weight_only_linear_cpu, silu_and_mul_cpu)):
            got = impl(x, qw, s, z, None, gated=True, **kw)
            assert got.shape == (rows, 32)
            assert torch.equal(got, act(impl(x, qw, s, z, None, **kw)))
    net = Network("gated")
    with net_guard(net):
        x = net.add_input("x", "float32", [-1, 256], [("n", (1, 4, 8))])
        y = OP(x, F.constant(qw), F.constant(s), None if z is None else F.constant(z), weight_format=fmt,
               group_size=group, gated=True)
        assert y.shape == (-1, 32)
        with pytest.raises(ValueError, match="weight_only_linear: gated must be true or false"):
            OP(x, F.constant(qw), F.constant(s), None if z is None else F.constant(z), weight_format=fmt,
               group_size=group, gated="yes")
