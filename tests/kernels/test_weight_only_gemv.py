"""weight_only_linear's CUDA implementation (cpp/kernels/weight_only_gemv.cuh) against the
reference (quantization/formats.py's quantized_linear_reference) on random data.

CPU: the implementation is registered, runs only on CUDA devices of a build with the kernels.
GPU (`-m gpu`): the GEMV kernel for any number of rows, the dequantization kernel bit for bit,
the op's choice of the two by rows, act-order permutations, the calls it leaves to the
reference, the binding's refusals, CUDA-graph replay, and `gated` (silu_and_mul in the GEMV's
epilogue) bit for bit against the GEMV then the activation kernel.

Tolerances, from the output dtype's rounding and K (eps: 2^-10 float16, 2^-7 bfloat16, the
spacing of the dtype relative to the value; mag = (|x| @ |W|^T), the sum of the products'
magnitudes):
- GEMV: the kernel and the reference sum the same float32 products in different orders (the
  kernel's tensor cores sum the exact products x * code of a group's part of a 4-pack k-step in
  float32, and it applies the group's scale (and zero, times the sum of x) once per such part;
  the reference rounds each W to float32 first): each is within K * 2^-24 * mag of the exact sum,
  so the two float32 results differ by at most (2K + 4) * 2^-24 * mag; each then rounds once to the dtype, which adds at
  most a spacing: eps * |expected|.
- dequantization + cuBLAS (more rows): W rounded to the dtype errs by eps / 2 relative per
  weight, independently, so the sum errs by about eps / sqrt(12) * sqrt(sum (x * w)^2); we allow
  4 * eps * that (14 of those standard deviations), two spacings of the output (cuBLAS may
  reduce split sums in the dtype), and the float32 term above. That path is also checked bit
  for bit against torch's matmul on the exactly dequantized weight.
"""
import os

import pytest
import torch
import torch.nn.functional as F

from tensorrt_llm.ops import CUDA, IMPLEMENTATIONS, OPS, implementations
from tensorrt_llm.ops.launch import cuda_kernels_available, launch
from tensorrt_llm.ops.quantized_linear import (
    GEMV_MAX_ROWS,
    cuda_serves,
    tile_codes,
    weight_only_linear_cuda,
    weight_only_linear_reference,
    weight_only_matmul_cuda,
)
from tensorrt_llm.quantization import dequantize, quantize_int4, quantize_int8, quantized_linear_reference
from tensorrt_llm.quantization.formats import Int4Weight

OP = OPS["weight_only_linear"]
EPS = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7, torch.float32: 2.0 ** -23}
FORMATS = [("int8", 0), ("int8", 32), ("int8", 64), ("int8", 128), ("int4", 32), ("int4", 64), ("int4", 128)]
ROWS = [1, 2, 3, 8, 16, 24, 32, 33, 64, 65, 200]
SHAPES = [(37, 384), (1000, 1536), (64, 14336)]  # N not a multiple of a block's warps; K of 12 .. 448 packs


# ---- CPU ----

def test_cuda_implementation_is_registered_for_cuda_devices_of_a_kernel_build():
    assert CUDA in OP.impls
    assert list(implementations("cpu")["weight_only_linear"]) == ["cpu", "reference"]
    on_cuda = list(implementations("cuda")["weight_only_linear"])
    assert on_cuda == (["cuda", "reference"] if cuda_kernels_available() else ["reference"])
    assert IMPLEMENTATIONS[CUDA](torch.device("cuda")) == cuda_kernels_available()
    x = torch.randn(2, 64)
    assert not cuda_serves(x, torch.zeros(8, 64, dtype=torch.int8), "int8")  # CPU tensors: never the kernels


# ---- GPU ----

gpu = pytest.mark.gpu
DEVICE = "cuda"


def _weight(gen, fmt, group, n, k, scale_dtype):
    w = torch.randn(n, k, generator=gen) * 0.05
    q = quantize_int8(w, group or None, scale_dtype=scale_dtype) if fmt == "int8" else \
        quantize_int4(w, group, scale_dtype=scale_dtype)
    return q


def _on_device(q):
    """The op's tensors (qweight, scales, zeros) of a formats.py weight, on the GPU."""
    zeros = getattr(q, "zeros", None)
    return q.qweight.to(DEVICE), q.scales.to(DEVICE), None if zeros is None else zeros.to(DEVICE)


def _inputs(gen, m, n, k, dtype):
    x = torch.randn(m, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    return x, bias


def _magnitudes(x, q, bias):
    """(|x| @ |W|^T, sqrt((x * w)^2 summed over k)) in float64 on the CPU."""
    xf, w = x.double().cpu(), dequantize(q).double()
    return xf.abs() @ w.abs().t(), ((xf * xf) @ (w * w).t()).sqrt()


def _check(got, want, x, q, bias, dtype, matmul_path, msg):
    got, want = got.double().cpu(), want.double().cpu()
    mag, rms = _magnitudes(x, q, bias)
    k = x.shape[-1]
    eps = EPS[dtype]
    tol = eps * want.abs() + (2 * k + 4) * 2.0 ** -24 * mag + 1e-6
    if matmul_path:
        tol = tol + eps * want.abs() + 4 * eps * rms
    err = (got - want).abs()
    worst = int((err - tol).argmax())
    assert bool((err <= tol).all()), (f"{msg}: error {err.flatten()[worst]:.3g} over the allowed "
                                      f"{tol.flatten()[worst]:.3g} at {worst} (expected {want.flatten()[worst]:.4g})")


def _gemv(x, qweight, scales, zeros, bias, fmt, group, tiled=False):
    out = torch.empty(x.shape[0], qweight.shape[0], dtype=x.dtype, device=x.device)
    launch("weight_only_gemv", out, x, qweight.view(torch.int32), scales, zeros, bias, fmt, group, tiled, False, 0.0)
    return out


@gpu
@pytest.mark.parametrize("scale_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt,group", FORMATS)
@pytest.mark.parametrize("m", ROWS)
def test_gemv_kernel_matches_reference(gen, needs_kernels, m, fmt, group, dtype, scale_dtype):
    # The kernel itself, for any number of rows (tiles of up to 32 rows per read of the weight).
    for n, k in SHAPES:
        q = _weight(gen, fmt, group, n, k, scale_dtype)
        qw, s, z = _on_device(q)
        x, bias = _inputs(gen, m, n, k, dtype)
        for b in (None, bias):
            want = quantized_linear_reference(x, q, b)
            got = _gemv(x.to(DEVICE), qw, s, z, None if b is None else b.to(DEVICE), fmt, group)
            _check(got, want, x, q, b, dtype, False, f"gemv {fmt}/{group} {m}x{n}x{k} bias={b is not None}")


@gpu
@pytest.mark.parametrize("case", ["float32_x", "x_rows_off_16_bytes"])
@pytest.mark.parametrize("fmt,group", [("int8", 0), ("int4", 32), ("int4", 128)])
def test_gemv_float32_kernel_cases(gen, needs_kernels, case, fmt, group):
    # float32 activations, and float16 rows of x off 16-byte boundaries, take the float32 kernel
    # (the tensor-core one reads x as 16-byte packs of float16 / bfloat16).
    n, k, m = 300, 1024, 3
    q = _weight(gen, fmt, group, n, k, torch.float32)
    qw, s, z = _on_device(q)
    if case == "float32_x":
        dtype = torch.float32
        x = torch.randn(m, k, generator=gen)
        xd = x.to(DEVICE)
    else:
        dtype = torch.float16
        wide = torch.randn(m, k + 1, generator=gen).to(dtype)
        x = wide[:, 1:].contiguous()
        xd = wide.to(DEVICE)[:, 1:]
    got = _gemv(xd, qw, s, z, None, fmt, group)
    _check(got, quantized_linear_reference(x, q), x, q, None, dtype, False, f"{case} {fmt}/{group}")


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt,group", FORMATS)
@pytest.mark.parametrize("m", ROWS)
def test_op_matches_reference(gen, needs_kernels, m, fmt, group, dtype):
    # The op chooses the GEMV up to GEMV_MAX_ROWS rows, dequantization + cuBLAS beyond.
    matmul_path = m > GEMV_MAX_ROWS
    for n, k in SHAPES:
        q = _weight(gen, fmt, group, n, k, torch.float32)  # the engine's scales and zeros are float32
        qw, s, z = _on_device(q)
        x, bias = _inputs(gen, m, n, k, dtype)
        xd = x.to(DEVICE)
        for b in (None, bias):
            bd = None if b is None else b.to(DEVICE)
            got = weight_only_linear_cuda(xd, qw, s, z, bd, weight_format=fmt, group_size=group)
            assert got.shape == (m, n) and got.dtype == dtype
            _check(got, quantized_linear_reference(x, q, b), x, q, b, dtype, matmul_path,
                   f"op {fmt}/{group} {m}x{n}x{k} bias={b is not None}")
            if matmul_path:
                assert torch.equal(got, F.linear(xd, dequantize(q).to(dtype).to(DEVICE), bd))


@gpu
def test_op_keeps_leading_dimensions(gen, needs_kernels):
    q = _weight(gen, "int4", 64, 100, 256, torch.float32)
    qw, s, z = _on_device(q)
    x = torch.randn(2, 3, 256, generator=gen).to(torch.bfloat16)
    got = weight_only_linear_cuda(x.to(DEVICE), qw, s, z, weight_format="int4", group_size=64)
    assert got.shape == (2, 3, 100)
    _check(got.reshape(6, 100), quantized_linear_reference(x, q).reshape(6, 100), x.reshape(6, 256), q, None,
           torch.bfloat16, False, "[2, 3, k]")


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt,group", FORMATS)
def test_dequantize_kernel_is_exact(gen, needs_kernels, fmt, group, scale_dtype, dtype):
    # W = code * scale (+ zero) in float32 without a fused multiply-add, rounded once: formats.py's
    # dequantize rounded to the dtype, bit for bit.
    if fmt == "int4" and scale_dtype == torch.bfloat16:
        scale_dtype = torch.float16  # bfloat16 INT4 scales and zeros: float16 covers the same code path
    q = _weight(gen, fmt, group, 333, 512, scale_dtype)
    qw, s, z = _on_device(q)
    out = torch.empty(333, 512, dtype=dtype, device=DEVICE)
    launch("weight_only_dequantize", out, qw.view(torch.int32), s, z, fmt, group, False)
    assert torch.equal(out.cpu(), dequantize(q).to(dtype))


@gpu
@pytest.mark.parametrize("group,scale_dtype", [(32, torch.float16), (64, torch.float16), (128, torch.float16),
                                               (128, torch.float32)])
@pytest.mark.parametrize("m", [1, 5, 40])
def test_act_order_permutation(gen, needs_kernels, group, scale_dtype, m):
    # GPTQ act-order: stored column j holds input perm[j]; the pipelined GEMV (float32 scales,
    # group 128, up to 8 rows) gathers x as it stages it, other calls gather x first.
    n, k, dtype = 304, 1024, torch.float16
    q = _weight(gen, "int4", group, n, k, scale_dtype)
    perm = torch.randperm(k, generator=gen)
    qp = Int4Weight(q.qweight, q.scales, q.zeros, group, perm)
    qw, s, z = _on_device(qp)
    x, bias = _inputs(gen, m, n, k, dtype)
    got = weight_only_matmul_cuda(x.to(DEVICE), qw, s, z, bias.to(DEVICE), weight_format="int4", group_size=group,
                                  perm=perm.to(DEVICE))
    _check(got, quantized_linear_reference(x, qp, bias), x, qp, bias, dtype, m > GEMV_MAX_ROWS, "act-order")


@gpu
@pytest.mark.parametrize("act_order", [False, True])
def test_int4_gemv_at_the_longest_rows_it_stages(gen, needs_kernels, act_order):
    # K = 32,768 at one row: x fills the pipelined kernel's 64 KB. Its scales and zeros (256 groups a
    # row) are staged in shared memory a tile ahead; with act-order's copy of x beside them they do
    # not fit, and the kernel reads them from L1 instead: both must give the reference's sums.
    n, k, dtype = 48, 32768, torch.bfloat16
    q = _weight(gen, "int4", 128, n, k, torch.float32)
    perm = torch.randperm(k, generator=gen) if act_order else None
    q = Int4Weight(q.qweight, q.scales, q.zeros, 128, perm)
    qw, s, z = _on_device(q)
    x, bias = _inputs(gen, 1, n, k, dtype)
    got = weight_only_matmul_cuda(x.to(DEVICE), qw, s, z, bias.to(DEVICE), weight_format="int4", group_size=128,
                                  perm=None if perm is None else perm.to(DEVICE))
    _check(got, quantized_linear_reference(x, q, bias), x, q, bias, dtype, False, f"act_order={act_order}")


@gpu
def test_int4_gemv_with_scales_off_16_byte_boundaries(gen, needs_kernels):
    # The kernel copies whole 16-byte pieces of scale and zero rows into shared memory; contiguous
    # views that start 4 bytes past a boundary take its L1 reads instead, with the same sums.
    n, k, group, dtype = 256, 4096, 128, torch.bfloat16
    q = _weight(gen, "int4", group, n, k, torch.float32)
    qw, s, z = _on_device(q)

    def shifted(t):
        out = torch.empty(t.numel() + 1, dtype=t.dtype, device=DEVICE)[1:].view(t.shape)
        return out.copy_(t)

    s_off, z_off = shifted(s), shifted(z)
    assert s_off.data_ptr() % 16 != 0 and s_off.is_contiguous()
    for m in (1, 3):
        x, bias = _inputs(gen, m, n, k, dtype)
        x = x.to(DEVICE)
        want = _gemv(x, qw, s, z, bias.to(DEVICE), "int4", group)
        got = _gemv(x, qw, s_off, z_off, bias.to(DEVICE), "int4", group)
        assert torch.equal(got, want), f"{m} rows"


@gpu
@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("form", ["plain", "gated", "norm", "add_norm", "add_norm_gated"])
def test_act_order_gather_in_the_gemv_is_the_gemv_of_the_gathered_x(gen, needs_kernels, form, tiled):
    """The pipelined INT4 GEMV's perm (act-order): x (and the norm's residual and weight) gathered as
    they are staged stage the same values as the gathered tensors would, so every output is bit for
    bit the GEMV of the gathered inputs; the norm's residual sum is written in x's own order."""
    n, k = 512, 4096
    perm = torch.randperm(k, generator=gen).to(DEVICE)
    qweight, scales, zeros = _on_device(_weight(gen, "int4", 128, n, k, torch.float32))
    if tiled:
        qweight = tile_codes(qweight)
    gated, norm, residual = "gated" in form, "norm" in form, form.startswith("add")
    for m in (1, 3, 8):
        x = (4 * torch.randn(m, k, generator=gen)).to(torch.bfloat16).to(DEVICE)
        r = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(DEVICE) if residual else None
        nw = (1 + 0.5 * torch.randn(k, generator=gen)).to(torch.bfloat16).to(DEVICE) if norm else None
        bias = torch.randn(n, generator=gen).to(torch.bfloat16).to(DEVICE) if m == 3 else None

        def run(x, r, nw, **extra):
            out = torch.empty(m, n // 2 if gated else n, dtype=x.dtype, device=DEVICE)
            kw = dict(extra, **({"norm_weight": nw} if norm else {}))
            if residual:
                kw.update(residual=r, residual_out=torch.empty_like(x))
            launch("weight_only_gemv", out, x, qweight.view(torch.int32), scales, zeros, bias, "int4", 128, tiled,
                   gated, 1e-5, **kw)
            return out, kw.get("residual_out")

        got, total = run(x, r, nw, perm=perm)
        want, _ = run(x[:, perm].contiguous(), None if r is None else r[:, perm].contiguous(),
                      None if nw is None else nw[perm].contiguous())
        assert torch.equal(got, want), f"{m} rows"
        if residual:
            assert torch.equal(total, x + r), "the residual sum in x's own order"
    # what the kernel does not take is refused, not misread
    x = torch.randn(9, k, generator=gen).to(torch.bfloat16).to(DEVICE)
    with pytest.raises(ValueError, match="perm takes INT4 weights, at most 8 rows"):
        launch("weight_only_gemv", torch.empty(9, n, dtype=x.dtype, device=DEVICE), x, qweight.view(torch.int32),
               scales, zeros, None, "int4", 128, tiled, False, 0.0, perm=perm)
    q8, s8, _ = _on_device(_weight(gen, "int8", 0, n, k, torch.float32))
    with pytest.raises(ValueError, match=r"perm takes INT4 weights.*\(got int8\)"):
        launch("weight_only_gemv", torch.empty(1, n, dtype=x.dtype, device=DEVICE), x[:1], q8.view(torch.int32),
               s8, None, None, "int8", 0, False, False, 0.0, perm=perm)


@gpu
@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("form", ["plain", "gated", "norm", "add_norm_gated"])
def test_int4_dual_tiles_give_the_single_tiles_bits(gen, needs_kernels, monkeypatch, form, tiled):
    """One row of x: the STAGED INT4 kernel takes two adjacent tiles of 16 rows at a time (DUAL)
    where n is a multiple of 32. Each output is the same sum in the same order as one tile at a
    time (TRTLLM_GEMV_DUAL=0, read at every launch), so the bits are equal; n = 528 keeps single
    tiles either way. The profiler shows the two launches ran different kernels where DUAL serves."""
    k = 4096
    gated, norm, residual = "gated" in form, "norm" in form, form.startswith("add")
    for n in (1024, 528):
        qweight, scales, zeros = _on_device(_weight(gen, "int4", 128, n, k, torch.float32))
        if tiled:
            qweight = tile_codes(qweight)
        x = (4 * torch.randn(1, k, generator=gen)).to(torch.bfloat16).to(DEVICE)
        kw = {"norm_weight": (1 + 0.5 * torch.randn(k, generator=gen)).to(torch.bfloat16).to(DEVICE)} if norm else {}
        if residual:
            kw.update(residual=torch.randn(1, k, generator=gen).to(torch.bfloat16).to(DEVICE))

        def run():
            out = torch.empty(1, n // 2 if gated else n, dtype=x.dtype, device=DEVICE)
            extra = dict(kw, residual_out=torch.empty_like(x)) if residual else kw
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                launch("weight_only_gemv", out, x, qweight.view(torch.int32), scales, zeros, None, "int4", 128,
                       tiled, gated, 1e-5, **extra)
                torch.cuda.synchronize()
            names = {e.name for e in prof.events() if "weightOnlyGemv" in e.name}
            return out, extra.get("residual_out"), names

        monkeypatch.delenv("TRTLLM_GEMV_DUAL", raising=False)
        dual, dual_total, dual_kernels = run()
        monkeypatch.setenv("TRTLLM_GEMV_DUAL", "0")
        single, single_total, single_kernels = run()
        assert dual_kernels and single_kernels
        assert (dual_kernels != single_kernels) == (n % 32 == 0), (n, dual_kernels, single_kernels)
        assert torch.equal(dual, single), f"{form} n={n}"
        if residual:
            assert torch.equal(dual_total, single_total)


@gpu
@pytest.mark.parametrize("case", ["int8_k_not_packs", "misaligned_weight"])
def test_unserved_calls_run_the_reference(gen, needs_kernels, case):
    dtype = torch.bfloat16
    if case == "int8_k_not_packs":  # per-channel INT8 with in_features 40: not whole 16-byte packs
        q = _weight(gen, "int8", 0, 24, 40, torch.float32)
        qw, s, z = _on_device(q)
    else:
        q = _weight(gen, "int8", 0, 24, 64, torch.float32)
        _, s, z = _on_device(q)
        flat = torch.zeros(24 * 64 + 4, dtype=torch.int8, device=DEVICE)
        qw = flat[4:].view(24, 64)
        qw.copy_(q.qweight)
    x = torch.randn(3, q.qweight.shape[1], generator=gen).to(dtype).to(DEVICE)
    assert not cuda_serves(x, qw, "int8")
    got = weight_only_linear_cuda(x, qw, s, z, weight_format="int8", group_size=0)
    assert torch.equal(got, weight_only_linear_reference(x, qw, s, z, weight_format="int8", group_size=0))


@gpu
def test_binding_refuses_what_the_kernels_cannot_read(needs_kernels):
    x = torch.zeros(2, 64, dtype=torch.float16, device=DEVICE)
    out = torch.empty(2, 8, dtype=torch.float16, device=DEVICE)
    words = torch.zeros(8, 8, dtype=torch.int32, device=DEVICE)  # INT4 [8, 64]
    scales = torch.ones(8, 2, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="weight_only_gemv: INT4 weights need zeros"):
        launch("weight_only_gemv", out, x, words, scales, None, None, "int4", 32, False, False, 0.0)
    with pytest.raises(ValueError, match="group_size 48"):
        launch("weight_only_gemv", out, x, words, scales, scales, None, "int4", 48, False, False, 0.0)
    with pytest.raises(ValueError, match="16-byte"):
        launch("weight_only_gemv", out, x[:, :56], words[:, :7], scales, scales, None, "int4", 32, False, False, 0.0)
    with pytest.raises(ValueError, match="weight_format"):
        launch("weight_only_gemv", out, x, words, scales, scales, None, "int2", 32, False, False, 0.0)
    # Tile order needs whole tiles of 16 rows and k-steps of 64 bytes: [8, 32 bytes] has neither.
    with pytest.raises(ValueError, match="tiled codes need out_features a multiple of 16"):
        launch("weight_only_gemv", out, x, words, scales, scales, None, "int4", 32, True, False, 0.0)
    with pytest.raises(ValueError, match="tiled codes"):
        launch("weight_only_dequantize", torch.empty(8, 64, dtype=torch.float16, device=DEVICE), words, scales,
               scales, "int4", 32, True)
    big = torch.zeros(1, 65536, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="more than the GEMV"):
        launch("weight_only_gemv", out[:1], big, torch.zeros(8, 8192, dtype=torch.int32, device=DEVICE),
               torch.ones(8, 512, dtype=torch.float16, device=DEVICE),
               torch.ones(8, 512, dtype=torch.float16, device=DEVICE), None, "int4", 128, False, False, 0.0)


@gpu
def test_replays_in_a_cuda_graph(gen, needs_kernels):
    dtype = torch.bfloat16
    q = _weight(gen, "int4", 128, 1000, 1024, torch.float32)
    qw, s, z = _on_device(q)
    static_x = torch.randn(2, 1024, generator=gen).to(dtype).to(DEVICE)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        weight_only_linear_cuda(static_x, qw, s, z, weight_format="int4", group_size=128)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = weight_only_linear_cuda(static_x, qw, s, z, weight_format="int4", group_size=128)
    for _ in range(2):
        x = torch.randn(2, 1024, generator=gen).to(dtype)
        static_x.copy_(x)
        graph.replay()
        _check(y, quantized_linear_reference(x, q), x, q, None, dtype, False, "graph replay")


# The cases both GEMV kernels serve (up to 8 rows, float32 scales, groups of whole k-steps or per
# channel); K = 384 leaves warps with no k-step, INT8 K = 400 ends in part of a k-step (25 packs).
# Up to two tiles an SM INT8 takes its k-steps in pairs (K = 1536: three a warp, a pair and one);
# 288 tiles (n = 4608) are past that on a GPU of 132 SMs, and take INT4's three blocks an SM.
_KERNEL_CASES = [(fmt, group, m, n, k) for fmt, group in [("int4", 128), ("int8", 0), ("int8", 64)]
                 for m in (1, 2, 5, 8) for n, k in [(37, 384), (1000, 1536), (64, 4096)]] + \
                [("int8", 0, m, 300, 400) for m in (1, 3)] + \
                [(fmt, group, 1, 4608, 1536) for fmt, group in [("int8", 0), ("int4", 128)]] + \
                [("int8", group, m, 256, 1536, x_range) for group in (0, 64) for m in (1, 2)
                 for x_range in (1e6, 1e-30, "chunks")] + \
                [("int8", 0, m, 9216, 1024, *x_range) for m, x_range in [(3, ()), (8, ()), (5, ("chunks",))]] + \
                [("fp8", per_channel, m, n, k) for per_channel in (0, 1) for m in (1, 2, 5, 8)
                 for n, k in [(37, 384), (1000, 1024)]] + \
                [("fp8", 1, m, n, k) for m in (1, 3) for n, k in [(64, 4096), (4608, 1536), (17408, 512)]]

_KERNEL_OUTPUTS = """
import sys, torch
from tensorrt_llm.ops.fp8_linear import fp8_linear_cuda
from tensorrt_llm.ops.quantized_linear import weight_only_linear_cuda
from tensorrt_llm.quantization import quantize_int4, quantize_int8
from tensorrt_llm.quantization.formats import fp8_scale_from_amax, quantize_fp8
outs = []
for i, (fmt, group, m, n, k, *x_range) in enumerate(eval(sys.argv[1])):
    gen = torch.Generator().manual_seed(i)
    w = torch.randn(n, k, generator=gen) * 0.05
    x = torch.randn(m, k, generator=gen)
    if fmt == "fp8":  # group: per-channel weight scales; the input scale from x's range
        q = quantize_fp8(w, per_channel=bool(group), input_scale=fp8_scale_from_amax(x.abs().amax()))
        bias = torch.randn(n, generator=gen).to(torch.bfloat16).cuda() if i % 2 else None
        y = fp8_linear_cuda(x.to(torch.bfloat16).cuda(), q.qweight.view(torch.uint8).cuda(), q.scale.cuda(),
                            q.input_scale.cuda(), bias)
        outs.append(y.cpu())
        continue
    if x_range == ["chunks"]:  # each k-step's 64 inputs at a power of two of its own, 2^-40 .. 2^40
        x = x * (2.0 ** torch.randint(-40, 41, (m, k // 64, 1), generator=gen)).expand(m, k // 64, 64).reshape(m, k)
    elif x_range:  # beyond float16's range, or far below its normal numbers
        x = x * x_range[0]
    x = x.to(torch.bfloat16).cuda()
    bias = torch.randn(n, generator=gen).to(torch.bfloat16).cuda()
    q = quantize_int8(w, group or None) if fmt == "int8" else quantize_int4(w, group)
    zeros = getattr(q, "zeros", None)
    y = weight_only_linear_cuda(x, q.qweight.cuda(), q.scales.cuda(), None if zeros is None else zeros.cuda(),
                                bias, weight_format=fmt, group_size=group)
    outs.append(y.cpu())
torch.save(outs, sys.argv[2])
"""


@gpu
def test_pipelined_kernel_agrees_with_the_register_kernel(needs_kernels, tmp_path):
    # The pipelined kernel by default, the other with TRTLLM_GEMV_PIPELINE=0 (read once per
    # process, hence the second process). INT8: the same products in the same order, so the same
    # bits, also where bfloat16 x goes through float16 scaled by a power of two per k-step (up to 2
    # rows, or up to 8 in layers of many tiles: x beyond float16's range, far below its normal
    # numbers, or k-steps 2^80 apart). FP8 (x quantized once per block): the same bits, per tensor
    # or per channel, at 2 and 3 blocks an SM and in pairs. INT4: the pipelined kernel sums x
    # (offset + code) and corrects with the k-step's sum of x, so the float32 sums differ by
    # roundings far below the output's: at most one bfloat16 step.
    import subprocess
    import sys
    outs = {}
    for knob in ("1", "0"):
        path = tmp_path / f"pipeline_{knob}.pt"
        env = dict(os.environ, TRTLLM_GEMV_PIPELINE=knob)
        run = subprocess.run([sys.executable, "-c", _KERNEL_OUTPUTS, repr(_KERNEL_CASES), str(path)], env=env,
                             capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        outs[knob] = torch.load(path)
    for case, new, old in zip(_KERNEL_CASES, outs["1"], outs["0"]):
        if case[0] != "int4":
            assert torch.equal(new, old), f"{case}: the kernels differ by {(new.float() - old.float()).abs().max():.3g}"
            continue
        new, old = new.float(), old.float()
        step = torch.finfo(torch.bfloat16).eps * torch.maximum(new.abs(), old.abs())  # >= one bfloat16 step
        diff = (new - old).abs()
        assert (diff <= step + 1e-6 * old.abs().max()).all(), f"{case}: the kernels differ by {diff.max():.3g}"
        assert (diff > 0).float().mean() < 0.05, f"{case}: {(diff > 0).float().mean():.1%} of the outputs differ"


# Shapes with a tile order (out_features a multiple of 16, rows of whole 64-byte k-steps), one of
# them with K = 384 (INT4: 3 k-steps, warps with none) and one of 128 tiles.
_TILED_SHAPES = [(16, 384), (96, 1024), (1008, 1536), (2048, 4096)]


@gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt,group", [("int8", 0), ("int8", 64), ("int4", 32), ("int4", 128)])
def test_tile_order_gives_row_orders_bits(gen, needs_kernels, fmt, group, dtype):
    # The same codes in tile order: every kernel (the pipelined GEMV up to 8 rows, the tensor-core
    # GEMV beyond and with float16 scales, the float32-activation kernel, the dequantization of
    # prompt steps) reads them where row order has them, and sums the same products in the same
    # order: the same output bits.
    for n, k in _TILED_SHAPES:
        for scale_dtype in (torch.float32, torch.float16):
            q = _weight(gen, fmt, group, n, k, scale_dtype)
            qw, s, z = _on_device(q)
            tiled = tile_codes(qw)
            assert not torch.equal(tiled, qw)
            for m in (1, 3, 8, 9, 32, 65):
                x = torch.randn(m, k, generator=gen).to(dtype).to(DEVICE)
                want = _gemv(x, qw, s, z, None, fmt, group) if m <= GEMV_MAX_ROWS else None
                if want is not None:
                    got = _gemv(x, tiled, s, z, None, fmt, group, tiled=True)
                    assert torch.equal(got, want), f"gemv {fmt}/{group} {m}x{n}x{k} {dtype} scales {scale_dtype}"
                got = weight_only_linear_cuda(x, tiled, s, z, weight_format=fmt, group_size=group, tiled=True)
                ref = weight_only_linear_cuda(x, qw, s, z, weight_format=fmt, group_size=group)
                assert torch.equal(got, ref), f"op {fmt}/{group} {m}x{n}x{k} {dtype} scales {scale_dtype}"
            out = torch.empty(n, k, dtype=dtype, device=DEVICE)
            launch("weight_only_dequantize", out, tiled.view(torch.int32), s, z, fmt, group, True)
            assert torch.equal(out.cpu(), dequantize(q).to(dtype))


# ---- gated: silu_and_mul in the GEMV's epilogue ----

from tensorrt_llm.ops.activation import silu_and_mul_cuda  # noqa: E402
from tensorrt_llm.ops.quantized_linear import gated_gemv_serves  # noqa: E402

GATED_FORMATS = [("int8", 0), ("int8", 64), ("int4", 128)]  # the pipelined kernel's groups
# gate_up [2I, K] as (2I, K): 1,792 tiles (three blocks an SM), 256 (two, INT8 k-steps in pairs),
# 384 (two), and small ones.
GATED_SHAPES = [(28672, 4096), (4096, 4096), (6144, 1024), (32, 256), (1008, 1280)]


@gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt,group", GATED_FORMATS)
@pytest.mark.parametrize("n,k", GATED_SHAPES)
@pytest.mark.parametrize("tiled", [False, True])
def test_gated_gemv_is_the_gemv_then_silu_and_mul(gen, needs_kernels, n, k, fmt, group, dtype, tiled):
    """weight_only_gemv(gated=True): silu_and_mul's kernel on the plain GEMV's output, bit for bit,
    at 1-8 rows, in row and tile order (a tile's 8 gate rows are one half of a tile in tile order)."""
    q = _weight(gen, fmt, group, n, k, torch.float32)
    qweight, scales, zeros = _on_device(q)
    if tiled:
        qweight = tile_codes(qweight)
    for m in (1, 3, 8):
        x, bias = (t.to(DEVICE) for t in _inputs(gen, m, n, k, dtype))
        bias = bias if m == 3 else None
        assert gated_gemv_serves(x, n, scales, fmt, group)
        out = torch.empty(m, n // 2, dtype=dtype, device=DEVICE)
        launch("weight_only_gemv", out, x, qweight.view(torch.int32), scales, zeros, bias, fmt, group, tiled, True, 0.0)
        want = silu_and_mul_cuda(_gemv(x, qweight, scales, zeros, bias, fmt, group, tiled))
        torch.testing.assert_close(out, want, rtol=0, atol=0, msg=f"{m} rows")


@gpu
@pytest.mark.parametrize("m", [1, 8, 9, 40])
def test_gated_op_is_the_op_then_silu_and_mul(gen, needs_kernels, m):
    """weight_only_linear(gated=True) on the GPU: the epilogue within its rows, the product then
    silu_and_mul beyond them (and for groups the pipelined kernel does not take); near the
    reference's silu_and_mul."""
    for fmt, group in (("int4", 128), ("int4", 32), ("int8", 0)):
        q = _weight(gen, fmt, group, 512, 1024, torch.float32)
        qweight, scales, zeros = _on_device(q)
        x, bias = (t.to(DEVICE) for t in _inputs(gen, m, 512, 1024, torch.bfloat16))
        kw = dict(weight_format=fmt, group_size=group)
        got = weight_only_linear_cuda(x, qweight, scales, zeros, bias, gated=True, **kw)
        assert got.shape == (m, 256)
        want = silu_and_mul_cuda(weight_only_linear_cuda(x, qweight, scales, zeros, bias, **kw))
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=f"{fmt} g{group}")
        ref = weight_only_linear_reference(x, qweight, scales, zeros, bias, gated=True, **kw)
        assert (got.float() - ref.float()).norm() <= 0.02 * ref.float().norm()


@gpu
def test_gated_binding_refuses_what_the_pipelined_kernel_cannot_take(gen, needs_kernels):
    q = _weight(gen, "int4", 32, 64, 256, torch.float32)
    qweight, scales, zeros = _on_device(q)
    x = torch.zeros(2, 256, dtype=torch.bfloat16, device=DEVICE)
    out = torch.empty(2, 32, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="weight_only_gemv: gated takes .*groups of at least 128 inputs"):
        launch("weight_only_gemv", out, x, qweight.view(torch.int32), scales, zeros, None, "int4", 32, False, True, 0.0)
    q = _weight(gen, "int8", 0, 64, 256, torch.float32)
    qweight, scales, _ = _on_device(q)
    x = torch.zeros(9, 256, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match=r"at most 8 rows .* \(got x \(bfloat16 \[9, 256\]"):
        launch("weight_only_gemv", torch.empty(9, 32, dtype=torch.bfloat16, device=DEVICE), x,
               qweight.view(torch.int32), scales, None, None, "int8", 0, False, True, 0.0)


# ---- the RMSNorm in front (kernels.h's WeightOnlyNorm) ------------------------------------------
# The fused GEMV computes out = inv * (W (s * norm_weight)) + bias, rounding s * norm_weight to
# bfloat16 where the norm kernel rounds s * inv * norm_weight: other bits, the same size of error.
# So both are measured against the op in float64 (from the same s): the fused error's RMS over the
# outputs within 1.25x the unfused one's (plus a float32 term), and every output within the
# bound both share, a half spacing of each product's input (2^-8 relative) over |W| |a|.

from tensorrt_llm.ops.norm import fused_add_rms_norm_cuda, rms_norm_cuda  # noqa: E402
from tensorrt_llm.ops.quantized_linear import (  # noqa: E402
    add_rms_norm_weight_only_linear_cuda,
    add_rms_norm_weight_only_linear_reference,
    norm_gemv_serves,
    rms_norm_weight_only_linear_cuda,
)

NORM_SHAPES = [(6144, 4096), (28672, 4096), (4096, 14336), (64, 256), (1008, 1280)]


def _norm_gemv_launch(x, residual, norm_weight, qweight, scales, zeros, bias, eps, tiled, gated):
    n = qweight.shape[0] // 2 if gated else qweight.shape[0]
    out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
    extra = {} if residual is None else {"residual": residual, "residual_out": torch.empty_like(x)}
    launch("weight_only_gemv", out, x, qweight.view(torch.int32), scales, zeros, bias, "int4", 128, tiled, gated, eps,
           norm_weight=norm_weight, **extra)
    return out, extra.get("residual_out")


@gpu
@pytest.mark.parametrize("n,k", NORM_SHAPES)
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("tiled", [False, True])
def test_norm_gemv_is_as_close_to_the_op_as_the_norm_kernel_then_the_gemv(gen, needs_kernels, n, k, residual, gated,
                                                                          tiled):
    q = _weight(gen, "int4", 128, n, k, torch.float32)
    qweight, scales, zeros = _on_device(q)
    if tiled:
        qweight = tile_codes(qweight)
    w64 = dequantize(q).double()
    eps = 1e-5
    norm_weight = (1 + 0.5 * torch.randn(k, generator=gen)).to(torch.bfloat16).to(DEVICE)
    sq, ref_sq, count, floor = 0.0, 0.0, 0, 0.0  # squared errors over every row of every call
    for m in (1, 2, 3, 8):
        if m * k * 2 > 64 * 1024:
            continue
        x = (4 * torch.randn(m, k, generator=gen)).to(torch.bfloat16).to(DEVICE)
        r = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(DEVICE) if residual else None
        bias = torch.randn(n, generator=gen).to(torch.bfloat16).to(DEVICE) if m == 3 else None
        got, total = _norm_gemv_launch(x, r, norm_weight, qweight, scales, zeros, bias, eps, tiled, gated)
        s = x + r if residual else x
        if residual:
            assert torch.equal(total, s), "residual_out is x + residual rounded to bfloat16"
        if residual:
            normed = fused_add_rms_norm_cuda(x, r, norm_weight, eps=eps)[0]
        else:
            normed = rms_norm_cuda(x, norm_weight, eps=eps)
        unfused = _gemv(normed, qweight, scales, zeros, bias, "int4", 128, tiled)
        s64 = s.double().cpu()
        a64 = s64 * torch.rsqrt(s64.square().mean(-1, keepdim=True) + eps) * norm_weight.double().cpu()
        y64 = a64 @ w64.t() + (0 if bias is None else bias.double().cpu())
        mag = a64.abs() @ w64.abs().t()
        floor = max(floor, (2 * k + 4) * 2.0 ** -24 * float(mag.mean()))
        if gated:  # silu(gate) * up of the op in float64; the RMS comparison only
            half = n // 2
            unfused = silu_and_mul_cuda(unfused)
            y64 = F.silu(y64[:, :half]) * y64[:, half:]
        err, ref_err = (got.double().cpu() - y64), (unfused.double().cpu() - y64)
        sq, ref_sq = sq + float(err.square().sum()), ref_sq + float(ref_err.square().sum())
        count += err.numel()
        if not gated:
            tol = 2.0 ** -8 * mag + EPS[torch.bfloat16] * y64.abs() + 1e-3
            assert bool((err.abs() <= tol).all()), f"{m} rows: error {err.abs().max():.3g}"
    # Over a few hundred outputs or more (each call's RMS ratio alone spreads 0.87-1.24 at 64
    # outputs; the mean ratio is 0.99-1.02 at every shape, H200).
    rms, ref_rms = (sq / count) ** 0.5, (ref_sq / count) ** 0.5
    assert rms <= 1.25 * ref_rms + floor, f"RMS error {rms:.3g} against the unfused {ref_rms:.3g}"


@gpu
@pytest.mark.parametrize("m", [1, 8, 9])
def test_norm_ops_on_the_gpu_keep_their_meaning(gen, needs_kernels, m):
    """rms_norm_weight_only_linear / add_rms_norm_weight_only_linear on the GPU: the fused GEMV up to
    8 rows of bfloat16 INT4, the norm kernel then the GEMV elsewhere (INT8, group 32, float16, 9
    rows: bit for bit the unfused ops); near the reference always."""
    k, n = 1024, 512
    for fmt, group, dtype in (("int4", 128, torch.bfloat16), ("int4", 32, torch.bfloat16), ("int8", 0, torch.bfloat16),
                              ("int4", 128, torch.float16)):
        qweight, scales, zeros = _on_device(_weight(gen, fmt, group, n, k, torch.float32))
        x, r = (torch.randn(m, k, generator=gen).to(dtype).to(DEVICE) for _ in range(2))
        norm_weight = (1 + 0.5 * torch.randn(k, generator=gen)).to(dtype).to(DEVICE)
        kw = dict(weight_format=fmt, group_size=group)
        fused = norm_gemv_serves(x, r, norm_weight, qweight, scales, **kw)
        assert fused == (m <= 8 and (fmt, group, dtype) == ("int4", 128, torch.bfloat16))
        got, total = add_rms_norm_weight_only_linear_cuda(x, r, norm_weight, qweight, scales, zeros, eps=1e-5, **kw)
        normed, want_total = fused_add_rms_norm_cuda(x, r, norm_weight, eps=1e-5)
        assert torch.equal(total, want_total)
        unfused = weight_only_linear_cuda(normed, qweight, scales, zeros, **kw)
        if not fused:
            assert torch.equal(got, unfused)
        ref, _ = add_rms_norm_weight_only_linear_reference(x, r, norm_weight, qweight, scales, zeros, eps=1e-5, **kw)
        assert (got.float() - ref.float()).norm() <= 0.02 * ref.float().norm()
        one = rms_norm_weight_only_linear_cuda(x, norm_weight, qweight, scales, zeros, eps=1e-5, **kw)
        plain = weight_only_linear_cuda(rms_norm_cuda(x, norm_weight, eps=1e-5), qweight, scales, zeros, **kw)
        assert (one.float() - plain.float()).norm() <= 0.02 * plain.float().norm()


@gpu
def test_norm_binding_refuses_what_the_fused_kernel_cannot_take(gen, needs_kernels):
    qweight, scales, zeros = _on_device(_weight(gen, "int4", 128, 64, 256, torch.float32))
    x = torch.zeros(2, 256, dtype=torch.bfloat16, device=DEVICE)
    w = torch.ones(256, dtype=torch.bfloat16, device=DEVICE)
    out = torch.empty(2, 64, dtype=torch.bfloat16, device=DEVICE)
    args = (out, x, qweight.view(torch.int32), scales, zeros, None, "int4", 128, False, False)
    with pytest.raises(ValueError, match="norm_weight takes INT4 weights and bfloat16 x"):
        launch("weight_only_gemv", out.half(), x.half(), *args[2:], 1e-5, norm_weight=w.half())
    with pytest.raises(ValueError, match=r"norm_weight takes at most 8 rows .* \(got x \(bfloat16 \[9, 256\]"):
        launch("weight_only_gemv", torch.empty(9, 64, dtype=torch.bfloat16, device=DEVICE),
               torch.zeros(9, 256, dtype=torch.bfloat16, device=DEVICE), *args[2:], 1e-5, norm_weight=w)
    with pytest.raises(ValueError, match="norm_weight takes .*float32 scales and groups of at least 128 inputs"):
        launch("weight_only_gemv", *args[:3], scales.half(), zeros.half(), *args[5:], 1e-5, norm_weight=w)
    with pytest.raises(ValueError, match="residual belongs to the RMSNorm"):
        launch("weight_only_gemv", *args, 1e-5, residual=x, residual_out=torch.empty_like(x))
    with pytest.raises(ValueError, match="residual_out"):
        launch("weight_only_gemv", *args, 1e-5, norm_weight=w, residual=x)
    with pytest.raises(ValueError, match="eps"):
        launch("weight_only_gemv", *args, -1.0, norm_weight=w)
