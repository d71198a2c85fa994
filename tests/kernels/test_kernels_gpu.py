"""The CUDA kernels against their references, on fresh random inputs of odd sizes, in every dtype.

Needs a GPU and a CUDA build of tensorrt_llm.bindings that covers it, e.g. on the GPU machine:
    python build_wheel.py -a native -s -i && pytest -m gpu tests/kernels -q
(or scripts/gpu_check.sh). The seed of each test is printed in its failure message.
"""

import pytest
import torch

from tensorrt_llm import kernels
from tensorrt_llm.kernels import reference
from tensorrt_llm.ops.activation import gelu_and_mul_reference, silu_and_mul_reference
from tensorrt_llm.ops.launch import stream_of, tensor_arg
from tensorrt_llm.ops.norm import fused_add_rms_norm_reference, rms_norm_reference

from .utils import DTYPES, assert_close, make_paged_metadata

pytestmark = pytest.mark.gpu
DEVICE = torch.device("cuda")


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels_cover_this_gpu():
    if not kernels.cuda_kernels_available():
        pytest.fail("tensorrt_llm.bindings has no CUDA kernels: build with `python build_wheel.py -a native -s -i`")
    archs = kernels.build_info()["cuda_architectures"]
    major, minor = torch.cuda.get_device_capability()
    sm = f"{major}{minor}"
    if f"sm_{sm}" not in archs and f"sm_{sm}a" not in archs and not any(a.startswith("compute_") for a in archs):
        pytest.fail(f"tensorrt_llm.bindings was built for {archs}, not this GPU (sm_{sm}): rebuild with -a native")


@pytest.fixture
def gen(seed):
    """The test's seeded CPU generator (conftest's seed), and the seed for messages."""
    return torch.Generator().manual_seed(seed), f"seed={seed}"


def rand(gen, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen[0]) * scale).to(dtype)


# ---- rms_norm ----

def _layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x (CPU) copied to the GPU as: contiguous, a row-strided slice, a misaligned view, or 3-D."""
    T, H = x.shape
    if layout == "contiguous":
        return x.to(DEVICE)
    if layout == "row_strided":
        wide = torch.zeros(T, H + 24, dtype=x.dtype, device=DEVICE)
        wide[:, 3:3 + H] = x.to(DEVICE)
        return wide[:, 3:3 + H]
    if layout == "misaligned":
        flat = torch.zeros(T * H + 1, dtype=x.dtype, device=DEVICE)
        flat[1:] = x.reshape(-1).to(DEVICE)
        return flat[1:].view(T, H)
    raise AssertionError(layout)


@pytest.mark.parametrize("layout", ["contiguous", "row_strided", "misaligned"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("hidden", [1000, 4097, 4096])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(gen, dtype, hidden, residual, layout):
    T = 37
    x = rand(gen, T, hidden, dtype=dtype, scale=3.0)
    w = rand(gen, hidden, dtype=dtype)
    eps = 1e-5
    if residual:
        r = rand(gen, T, hidden, dtype=dtype)
        out, summed = kernels.rms_norm(_layout(x, layout), w.to(DEVICE), eps, residual=_layout(r, layout))
        ref_out, ref_sum = fused_add_rms_norm_reference(x, r, w, eps=eps)
        assert torch.equal(summed.cpu(), ref_sum), gen[1]  # one correctly rounded add: bit-exact
    else:
        out = kernels.rms_norm(_layout(x, layout), w.to(DEVICE), eps)
        ref_out = rms_norm_reference(x, w, eps=eps)
    assert out.shape == x.shape and out.dtype == dtype and out.device.type == DEVICE.type
    assert_close(out, ref_out, dtype, gen[1])


def test_rms_norm_3d_and_empty(gen):
    x = rand(gen, 3, 13, 257, dtype=torch.bfloat16)
    w = rand(gen, 257, dtype=torch.bfloat16)
    assert_close(kernels.rms_norm(x.to(DEVICE), w.to(DEVICE), 1e-6), rms_norm_reference(x, w, eps=1e-6),
                 torch.bfloat16, gen[1])
    empty = torch.empty(0, 257, dtype=torch.bfloat16, device=DEVICE)
    assert kernels.rms_norm(empty, w.to(DEVICE), 1e-6).shape == (0, 257)


# ---- rotary ----

@pytest.mark.parametrize("positions_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("head_dim,rotary_dim", [(64, 64), (128, 128), (80, 80), (128, 64), (80, 32)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_embedding(gen, dtype, head_dim, rotary_dim, is_neox, packed, positions_dtype):
    T, Hq, KV, max_pos = 37, 7, 3, 4099
    theta = 500000.0 if is_neox else 10000.0
    cache = kernels.rope_cos_sin_cache(max_pos, rotary_dim, theta)
    positions = torch.randint(0, max_pos, (T,), generator=gen[0], dtype=positions_dtype)
    q = rand(gen, T, Hq, head_dim, dtype=dtype)
    k = rand(gen, T, KV, head_dim, dtype=dtype)
    if packed:
        v = rand(gen, T, KV, head_dim, dtype=dtype)
        qkv = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v.reshape(T, -1)], dim=1).to(DEVICE)
        q_dev = qkv[:, :Hq * head_dim].view(T, Hq, head_dim)
        k_dev = qkv[:, Hq * head_dim:(Hq + KV) * head_dim].view(T, KV, head_dim)
    else:
        q_dev, k_dev = q.to(DEVICE), k.to(DEVICE)
    q_ref, k_ref = q.clone(), k.clone()
    kernels.rotary_embedding_(q_dev, k_dev, positions.to(DEVICE), cache.to(DEVICE), is_neox)
    reference.rotary_embedding_(q_ref, k_ref, positions, cache, is_neox)
    assert_close(q_dev, q_ref, dtype, gen[1])
    assert_close(k_dev, k_ref, dtype, gen[1])
    if packed:
        assert torch.equal(qkv[:, (Hq + KV) * head_dim:].cpu(), v.reshape(T, -1)), "v was modified"


def test_rotary_out_of_range_positions_leave_tokens_unchanged(gen):
    T, H, D = 9, 2, 64
    cache = kernels.rope_cos_sin_cache(100, D).to(DEVICE)
    positions = torch.tensor([0, 5, 100, -1, 99, 1 << 40, 7, 3, 2], dtype=torch.int64)
    bad = torch.tensor([2, 3, 5])
    q = rand(gen, T, H, D)
    k = rand(gen, T, 1, D)
    q_dev, k_dev = q.clone().to(DEVICE), k.clone().to(DEVICE)
    kernels.rotary_embedding_(q_dev, k_dev, positions.to(DEVICE), cache, True)
    torch.cuda.synchronize()
    assert torch.equal(q_dev.cpu()[bad], q[bad]) and torch.equal(k_dev.cpu()[bad], k[bad])
    good = torch.tensor([0, 1, 4, 6, 7, 8])
    q_ref, k_ref = q[good].clone(), k[good].clone()
    reference.rotary_embedding_(q_ref, k_ref, positions[good], cache.cpu(), True)
    assert_close(q_dev.cpu()[good], q_ref, torch.float32, gen[1])
    assert_close(k_dev.cpu()[good], k_ref, torch.float32, gen[1])


# ---- gated activations ----

@pytest.mark.parametrize("op", ["silu", "gelu_none", "gelu_tanh"])
@pytest.mark.parametrize("inter", [1000, 4097, 11008])
@pytest.mark.parametrize("dtype", DTYPES)
def test_act_and_mul(gen, dtype, inter, op):
    x = rand(gen, 37, 2 * inter, dtype=dtype, scale=2.0)
    if op == "silu":
        out, ref = kernels.silu_and_mul(x.to(DEVICE)), silu_and_mul_reference(x)
    else:
        approx = op.split("_")[1]
        out, ref = kernels.gelu_and_mul(x.to(DEVICE), approx), gelu_and_mul_reference(x, approximate=approx)
    assert out.shape == (37, inter) and out.dtype == dtype
    assert_close(out, ref, dtype, gen[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_act_and_mul_strided_and_3d(gen, dtype):
    x = rand(gen, 2, 19, 2 * 333, dtype=dtype)
    wide = torch.zeros(2, 19, 2 * 333 + 5, dtype=dtype, device=DEVICE)
    wide[..., 1:1 + 2 * 333] = x.to(DEVICE)
    view = wide[..., 1:1 + 2 * 333]
    assert_close(kernels.silu_and_mul(view), silu_and_mul_reference(x), dtype, gen[1])
    assert_close(kernels.gelu_and_mul(view, "tanh"), gelu_and_mul_reference(x, approximate="tanh"), dtype, gen[1])


# ---- paged kv write ----

@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("kv_heads,head_dim,tpb", [(7, 64, 16), (1, 128, 32), (3, 80, 7), (2, 5, 3)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_kv_write(gen, dtype, kv_heads, head_dim, tpb, packed):
    g = gen[0]
    batch = 6
    seq_new = [int(v) for v in torch.randint(0, 20, (batch,), generator=g)]
    seq_new[0] = 1
    past = [int(v) for v in torch.randint(0, 50, (batch,), generator=g)]
    num_blocks = sum(-(-(p + n) // tpb) for p, n in zip(past, seq_new)) + 5
    tables, cu, past_t = make_paged_metadata(seq_new, past, tpb, num_blocks, g)
    T = sum(seq_new)
    key = rand(gen, T, kv_heads, head_dim, dtype=dtype)
    value = rand(gen, T, kv_heads, head_dim, dtype=dtype)
    cache = rand(gen, num_blocks, 2, kv_heads, tpb, head_dim, dtype=dtype)
    if packed:  # key / value as views of a packed qkv row
        qkv = torch.cat([rand(gen, T, 3 * head_dim, dtype=dtype), key.reshape(T, -1), value.reshape(T, -1)],
                        dim=1).to(DEVICE)
        k_dev = qkv[:, 3 * head_dim:(3 + kv_heads) * head_dim].view(T, kv_heads, head_dim)
        v_dev = qkv[:, (3 + kv_heads) * head_dim:].view(T, kv_heads, head_dim)
    else:
        k_dev, v_dev = key.to(DEVICE), value.to(DEVICE)
    expected = cache.clone()
    cache_dev = cache.to(DEVICE)
    kernels.paged_kv_write_(k_dev, v_dev, cache_dev, tables.to(DEVICE), cu.to(DEVICE), past_t.to(DEVICE))
    reference.paged_kv_write_(key, value, expected, tables, cu, past_t)
    assert torch.equal(cache_dev.cpu(), expected), gen[1]  # a copy: bit-exact, nothing else touched


def test_paged_kv_write_skips_bad_metadata(gen):
    """Out-of-range block ids, positions past the table and tokens past cu_seqlens write nothing."""
    g = gen[0]
    tpb, KV, D = 4, 2, 16
    seq_new, past = [3, 5, 2, 4, 3], [0, 2, 6, 1, 0]
    tables, cu, past_t = make_paged_metadata(seq_new, past, tpb, 16, g)
    T = sum(seq_new)
    tables[1, 0] = 16          # sequence 1's first block: past the pool
    tables[2, 1] = -3          # sequence 2's second block: negative
    past_t[3] = 1 + 4 * tables.shape[1]  # sequence 3 starts past its block table
    cu_bad = cu.clone()
    cu_bad[-1] = T - 1         # the last token (of sequence 4) belongs to no sequence
    key = rand(gen, T, KV, D)
    value = rand(gen, T, KV, D)
    cache = torch.zeros(16, 2, KV, tpb, D)
    cache_dev = cache.clone().to(DEVICE)
    kernels.paged_kv_write_(key.to(DEVICE), value.to(DEVICE), cache_dev, tables.to(DEVICE), cu_bad.to(DEVICE),
                            past_t.to(DEVICE))
    torch.cuda.synchronize()
    expected = cache.clone()
    for b in range(5):
        for t in range(int(cu_bad[b]), int(cu_bad[b + 1])):
            p = int(past_t[b]) + t - int(cu_bad[b])
            if p // tpb >= tables.shape[1]:
                continue
            block = int(tables[b, p // tpb])
            if 0 <= block < 16:
                expected[block, 0, :, p % tpb] = key[t]
                expected[block, 1, :, p % tpb] = value[t]
    assert torch.count_nonzero(expected) > 0
    assert torch.equal(cache_dev.cpu(), expected), gen[1]


# ---- errors on the GPU ----

def test_errors_name_devices_dtypes_and_shapes():
    x = torch.randn(5, 8, device=DEVICE, dtype=torch.float16)
    w = torch.randn(8, device=DEVICE, dtype=torch.float16)
    with pytest.raises(ValueError, match=r"weight \(float16 \[8\] on cpu\) must be a CUDA tensor"):
        kernels.rms_norm(x, w.cpu())
    with pytest.raises(TypeError, match="weight is float32 but x is float16"):
        kernels.rms_norm(x, w.float())
    with pytest.raises(ValueError, match=r"weight must have shape \[8\], got \[7\]"):
        kernels.rms_norm(x, w[:7])
    q = torch.randn(3, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="positions .* on cpu"):
        kernels.rotary_embedding_(q, q[:, :1].clone(), torch.arange(3), kernels.rope_cos_sin_cache(8, 64).cuda())
    b = kernels.get_bindings()
    host = torch.randn(5, 8, dtype=torch.float16)
    claimed = tensor_arg(host)[:4] + (torch.cuda.current_device(),)  # a host pointer said to be on the GPU
    with pytest.raises(ValueError, match="x is not CUDA device memory"):
        b.rms_norm(tensor_arg(torch.empty_like(x)), claimed, tensor_arg(w), 1e-6, stream_of(x))
    missing = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"device {missing} does not exist"):
        out = torch.empty(5, 4, device=DEVICE, dtype=torch.float16)
        b.silu_and_mul(tensor_arg(out)[:4] + (missing,), tensor_arg(x)[:4] + (missing,), stream_of(x))
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="different devices"):
            kernels.rms_norm(x, w.to("cuda:1"))
    # the process and the CUDA context are fine afterwards
    assert_close(kernels.rms_norm(x, w), rms_norm_reference(x.cpu(), w.cpu(), eps=1e-6), torch.float16)
    torch.cuda.synchronize()


# ---- composition: streams, CUDA graphs, torch.compile ----

def test_runs_on_the_current_stream(gen):
    x = rand(gen, 37, 2 * 1000, dtype=torch.float16)
    side = torch.cuda.Stream()
    x_dev = x.to(DEVICE)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = kernels.silu_and_mul(x_dev)
    side.synchronize()
    assert_close(out, silu_and_mul_reference(x), torch.float16, gen[1])


def test_cuda_graph_capture_and_replay(gen):
    w = rand(gen, 1000, dtype=torch.bfloat16).to(DEVICE)
    static_x = torch.zeros(37, 1000, dtype=torch.bfloat16, device=DEVICE)
    static_r = torch.zeros_like(static_x)

    def step():
        normed, summed = kernels.rms_norm(static_x, w, 1e-6, residual=static_r)
        return normed, kernels.silu_and_mul(normed), summed

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        n, y, s = step()
    for _ in range(2):
        x, r = rand(gen, 37, 1000, dtype=torch.bfloat16), rand(gen, 37, 1000, dtype=torch.bfloat16)
        static_x.copy_(x)
        static_r.copy_(r)
        graph.replay()
        torch.cuda.synchronize()
        ref_normed, ref_sum = fused_add_rms_norm_reference(x, r, w.cpu(), eps=1e-6)
        assert torch.equal(s.cpu(), ref_sum), gen[1]
        # Each kernel against the reference of its own input: the activation of the reference's
        # norm would add the norm's rounding differences to the activation's (up to ~3 units in the
        # last place of bfloat16, past one kernel's tolerance).
        assert_close(n, ref_normed, torch.bfloat16, gen[1])
        assert_close(y, silu_and_mul_reference(n.cpu()), torch.bfloat16, gen[1])


def test_torch_compile_fullgraph(gen):
    @torch.compile(fullgraph=True)
    def f(x, w, r):
        normed, summed = kernels.rms_norm(x, w, 1e-6, residual=r)
        return kernels.gelu_and_mul(normed, "tanh"), summed

    x, r = rand(gen, 37, 1000, dtype=torch.float16), rand(gen, 37, 1000, dtype=torch.float16)
    w = rand(gen, 1000, dtype=torch.float16)
    y, s = f(x.to(DEVICE), w.to(DEVICE), r.to(DEVICE))
    ref_normed, ref_sum = fused_add_rms_norm_reference(x, r, w, eps=1e-6)
    assert torch.equal(s.cpu(), ref_sum)
    assert_close(y, gelu_and_mul_reference(ref_normed, approximate="tanh"), torch.float16, gen[1])
