"""The host (CPU) weight-only GEMV, cpp/kernels/host_weight_only_gemv.cpp, against a plain float64
reference of what it computes: x quantized per block of 32 inputs to int8 (scale = the block's
largest |x| / 127, round half to even), each weight group's codes times those int8 values, scaled
by weight scale x block scale; INT4's zeros times the float sums of x per group."""
import pytest
import torch

from tensorrt_llm.ops.launch import bindings_available, get_bindings, launch, tensor_arg
from tensorrt_llm.ops.quantized_linear import host_gemv_rows, tile_codes, weight_only_linear_cpu
from tensorrt_llm.quantization import quantize_int4, quantize_int8
from tensorrt_llm.quantization.formats import unpack_int4

pytestmark = pytest.mark.skipif(not bindings_available() or not get_bindings().host_weight_only_gemv_available(),
                                reason="needs the compiled bindings on a CPU with AVX2 and FMA")


def quantized_x(x: torch.Tensor) -> torch.Tensor:
    """x [m, k] as the kernel sees it: per block of 32, int8 codes times the block's scale (float64)."""
    blocks = x.double().view(x.shape[0], -1, 32)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / 127
    codes = torch.where(scale > 0, torch.round(blocks / torch.where(scale > 0, scale, 1)), 0)
    return (codes * scale).view_as(x)


def quantized(fmt: str, w: torch.Tensor, group: int):
    """W in the kernel's format: INT4 in groups of `group`, INT8 per channel (group 0) or in groups."""
    if fmt == "int4":
        return quantize_int4(w, group, scale_dtype=torch.float32)
    return quantize_int8(w, group or None, scale_dtype=torch.float32)


def reference(x, fmt, q, group, bias):
    xq = quantized_x(x)
    if fmt == "int4":
        codes = unpack_int4(q.qweight).double()
        s = q.scales.double().repeat_interleave(group, 1)
        y = xq @ (codes * s).T + x.double().view(x.shape[0], -1, group).sum(-1) @ q.zeros.double().T
    else:
        s = q.scales.double()
        s = s[:, None] if s.dim() == 1 else s.repeat_interleave(group, 1)
        y = xq @ (q.qweight.double() * s).T
    return y if bias is None else y + bias.double()


# Where the CPU has AVX-512 VNNI, shapes of an even number of blocks take the two-blocks-a-step
# path; the last two (3 and 7 blocks) the AVX2 path there too.
CASES = [("int4", 32, 960, 576), ("int4", 64, 80, 256), ("int4", 128, 48, 1536), ("int8", 0, 576, 1536),
         ("int8", 32, 100, 576), ("int8", 64, 16, 128), ("int4", 32, 1000, 64), ("int8", 0, 1003, 576),
         ("int4", 32, 40, 96), ("int8", 0, 37, 224)]


@pytest.mark.parametrize("fmt,group,n,k", CASES)
@pytest.mark.parametrize("m", [1, 3, 8])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("threads", [1, 3])
def test_matches_the_int8_x_reference_on_random_data(fmt, group, n, k, m, with_bias, threads):
    torch.manual_seed(n * 7 + k + m)
    w = torch.randn(n, k) * 0.05
    q = quantized(fmt, w, group)
    x = torch.randn(m, k)
    x[0, :32] = 0.0  # a block of zeros: scale 0
    bias = torch.randn(n) if with_bias else None
    out = torch.full((m, n), float("nan"))
    # Temporaries as arguments: launch keeps them alive through the call (host memory is reused at once).
    launch("host_weight_only_gemv", out, x.clone(), q.qweight.clone(), q.scales.clone(),
           None if fmt == "int8" else q.zeros.clone(), None if bias is None else bias.clone(), fmt, group, threads)
    expected = reference(x, fmt, q, group, bias)
    assert (out.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


@pytest.mark.parametrize("fmt,group,n,k", [("int4", 32, 1003, 576), ("int8", 0, 530, 1536), ("int8", 64, 37, 256)])
@pytest.mark.parametrize("m", [2, 3, 5, 8])
def test_rows_together_are_the_rows_one_by_one_bit_for_bit(fmt, group, n, k, m):
    """A pass over W serves up to 4 rows of x: each output is the same sum in the same order as
    the row's own call."""
    torch.manual_seed(m)
    w = torch.randn(n, k) * 0.05
    q = quantized(fmt, w, group)
    zeros = None if fmt == "int8" else q.zeros
    x = torch.randn(m, k)
    together = torch.empty(m, n)
    launch("host_weight_only_gemv", together, x, q.qweight, q.scales, zeros, None, fmt, group, 2)
    for r in range(m):
        alone = torch.empty(1, n)
        launch("host_weight_only_gemv", alone, x[r:r + 1].clone(), q.qweight, q.scales, zeros, None, fmt, group, 1)
        assert torch.equal(together[r], alone[0]), f"row {r}"


def test_the_cpu_op_takes_it_for_decode_rows():
    """One row everywhere; up to HOST_GEMV_MAX_ROWS where PyTorch has no AVX-512 int kernels or
    the kernel has AVX-512 VNNI."""
    torch.manual_seed(0)
    q = quantize_int4(torch.randn(64, 256) * 0.05, 32, scale_dtype=torch.float32)
    most = host_gemv_rows("int4", 256, 32)
    behind = (torch.backends.cpu.get_cpu_capability().startswith("AVX512")
              and not get_bindings().host_weight_only_gemv_vnni())
    assert most == (1 if behind else 8)
    for m in sorted({1, most}):
        x = torch.randn(m, 256, dtype=torch.bfloat16)
        y = weight_only_linear_cpu(x, q.qweight, q.scales, q.zeros, weight_format="int4", group_size=32)
        assert y.dtype == torch.bfloat16 and y.shape == (m, 64)
        direct = torch.empty(m, 64)
        launch("host_weight_only_gemv", direct, x.float(), q.qweight, q.scales, q.zeros, None, "int4", 32, 1)
        assert torch.equal(y, direct.to(torch.bfloat16))


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_codes_in_tile_order_give_row_orders_outputs(fmt):
    torch.manual_seed(1)
    w = torch.randn(32, 256) * 0.05
    q = quantized(fmt, w, 32)
    zeros = getattr(q, "zeros", None)
    for m in (1, 2):  # one row takes the host kernel on every CPU; two, PyTorch's where it has AVX-512
        x = torch.randn(m, 256)
        rows = weight_only_linear_cpu(x, q.qweight, q.scales, zeros, weight_format=fmt, group_size=32)
        tiled = weight_only_linear_cpu(x, tile_codes(q.qweight), q.scales, zeros, weight_format=fmt, group_size=32,
                                       tiled=True)
        assert torch.equal(rows, tiled)


def test_refusals_name_the_argument():
    b = get_bindings()
    q = quantize_int4(torch.randn(16, 64), 32, scale_dtype=torch.float32)
    x, out = torch.randn(1, 64), torch.empty(1, 16)
    args = [tensor_arg(t) for t in (out, x, q.qweight, q.scales, q.zeros)]
    with pytest.raises(ValueError, match=r"^host_weight_only_gemv: weight_format must be 'int8' or 'int4', "
                                         r"got 'int2'$"):
        b.host_weight_only_gemv(*args, None, "int2", 32, 1)
    with pytest.raises(ValueError, match=r"^host_weight_only_gemv: no kernel for in_features 64 in groups of 16"):
        b.host_weight_only_gemv(*args, None, "int4", 16, 1)
    with pytest.raises(ValueError, match=r"^host_weight_only_gemv: INT4 takes zeros$"):
        b.host_weight_only_gemv(*args[:4], None, None, "int4", 32, 1)
    on_gpu = tensor_arg(out)[:4] + (0,)
    with pytest.raises(ValueError, match=r"host_weight_only_gemv: out \(float32 \[1, 16\] on cuda:0\) must be a host "
                                         r"\(CPU\) tensor"):
        b.host_weight_only_gemv(on_gpu, *args[1:], None, "int4", 32, 1)
    with pytest.raises(ValueError, match=r"^host_weight_only_gemv: threads must be in \[1, 1024\], got 0$"):
        b.host_weight_only_gemv(*args, None, "int4", 32, 0)


def _gemv_rows(seed: int, threads: int) -> list:
    """A 256-row INT4 GEMV (two parts of 128 rows at threads=2) on data made from seed (PyTorch's
    own ops on one thread: its OpenMP team does not survive a fork)."""
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(seed)
        q = quantize_int4(torch.randn(256, 64) * 0.05, 32, scale_dtype=torch.float32)
        x, out = torch.randn(1, 64), torch.empty(1, 256)
        launch("host_weight_only_gemv", out, x, q.qweight, q.scales, q.zeros, None, "int4", 32, threads)
        return out.tolist()
    finally:
        torch.set_num_threads(torch_threads)


def test_threads_split_the_rows_and_a_forked_child_starts_its_own_pool():
    """Two threads give what one gives; a child forked after the pool's workers started (which it
    does not inherit) still completes its calls instead of waiting on workers it does not have."""
    import multiprocessing

    assert _gemv_rows(4, 2) == _gemv_rows(4, 1)
    with multiprocessing.get_context("fork").Pool(1) as children:
        assert children.apply_async(_gemv_rows, (4, 2)).get(timeout=120) == _gemv_rows(4, 1)
