"""gpt_attention over a quantized KV cache (1-byte INT8 / FP8 codes with K and V scales,
quantization/formats.py): the reference is exactly float attention over the dequantized values;
the CUDA kernels (paged write, decode attention with its fused RoPE + write, the varlen path of
prompts and chunks over a cached past) against the reference on random data.

GPU tests: pytest -m gpu tests/ops/test_attention_kv_quant.py (needs the compiled CUDA kernels).
"""
import math
import os

import pytest
import torch

from tensorrt_llm import kernels
from tensorrt_llm.functional import rope_cos_sin_cache
from tensorrt_llm.kernels import reference
from tensorrt_llm.network import Network, net_guard
from tensorrt_llm.ops import attention_cuda
from tensorrt_llm.ops.attention import gpt_attention, gpt_attention_reference
from tensorrt_llm.quantization.formats import KV_CACHE_STORAGE, dequantize_kv, kv_cache_scale_from_amax, quantize_kv

ALGOS = ["FP8", "INT8"]
HALF = [torch.bfloat16, torch.float16]


def code_pool(shape, algo, scale, gen):
    """A pool [..., 2, KV, tpb, D] of random codes (K and V of N(0, 1)-ish values under `scale`)."""
    x = torch.randn(shape, generator=gen) * 1.5
    kv_dim = len(shape) - 4  # the K/V axis
    scales = scale.view(2, *([1] * (len(shape) - kv_dim - 1)))
    return quantize_kv(x, scales, algo).view(KV_CACHE_STORAGE[algo])


def dequantized(pool, scale):
    kv_dim = pool.dim() - 4
    return dequantize_kv(pool, scale.view(2, *([1] * (pool.dim() - kv_dim - 1))).to(pool.device))


def step_inputs(specs, heads, kv_heads, head_dim, tpb, dtype, gen, device="cpu"):
    """One step of sequences (cached past, new tokens): block tables of distinct random blocks,
    packed q/k/v of the new tokens, lengths and positions."""
    lengths = [p + n for p, n in specs]
    needed = [-(-n // tpb) for n in lengths]
    max_blocks = max(needed) + 1
    num_blocks = sum(needed) + 3
    perm = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = torch.full((len(specs), max_blocks), int(perm[-1]), dtype=torch.int32)
    used = 0
    for b, n in enumerate(needed):
        tables[b, :n] = perm[used:used + n]
        used += n
    new = torch.tensor([n for _, n in specs], dtype=torch.int32)
    tokens = int(new.sum())
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    return dict(qkv=qkv.to(device), tables=tables.to(device),
                lengths=torch.tensor(lengths, dtype=torch.int32).to(device), new=new.to(device), host_new=new,
                host_lengths=torch.tensor(lengths, dtype=torch.int32),
                positions=torch.cat([torch.arange(p, p + n) for p, n in specs]).to(torch.int32).to(device),
                num_blocks=num_blocks)


def run(op, step, pool, heads, kv_heads, head_dim, tpb, kv_scale, cos_sin=None):
    qkv = step["qkv"].clone()
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=1)
    rotary = dict(rotary_dim=head_dim, rotary_is_neox=True) if cos_sin is not None else {}
    return op(q, k, v, pool, step["tables"], step["lengths"], step["new"], step["host_new"], None,
              step["positions"] if cos_sin is not None else None, cos_sin, step["host_lengths"], kv_scale,
              layer_idx=1, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, tokens_per_block=tpb,
              **rotary)


# ---- the reference: float attention over the dequantized values, exactly ---------------------

@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("specs", [[(0, 9), (0, 3)], [(5, 1), (17, 1), (8, 1)], [(4, 1), (11, 6), (0, 5)]],
                         ids=["prompts", "decode", "mixed"])
def test_reference_equals_float_attention_over_dequantized_values(algo, specs):
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, head_dim, tpb = 4, 2, 16, 4
    step = step_inputs(specs, heads, kv_heads, head_dim, tpb, torch.float32, gen)
    scale = torch.tensor([0.02, 0.013])
    pool = code_pool((2, step["num_blocks"], 2, kv_heads, tpb, head_dim), algo, scale, gen)
    before = pool.clone()
    out = run(gpt_attention_reference, step, pool, heads, kv_heads, head_dim, tpb, scale)
    # The float path sees the dequantized past and this step's K/V as the cache rounds them.
    kv_cols = kv_heads * head_dim
    float_step = dict(step)
    k, v = step["qkv"][:, heads * head_dim:].split(kv_cols, dim=1)
    float_step["qkv"] = torch.cat([step["qkv"][:, :heads * head_dim], dequantize_kv(quantize_kv(k, scale[0], algo),
                                   scale[0]), dequantize_kv(quantize_kv(v, scale[1], algo), scale[1])], dim=1)
    float_pool = dequantized(before, scale)
    ref = run(gpt_attention_reference, float_step, float_pool, heads, kv_heads, head_dim, tpb, None)
    assert torch.equal(out, ref)
    # the codes written are the new rows' codes, and the float pool holds their values
    assert torch.equal(dequantized(pool, scale), float_pool)
    assert not torch.equal(pool[1], before[1]) and torch.equal(pool[0], before[0])


def test_graph_op_checks_the_pool_and_scales():
    net = Network(name="t")
    with net_guard(net):
        q = net.add_input("q", "float16", [5, 64])
        k = net.add_input("k", "float16", [5, 32])
        v = net.add_input("v", "float16", [5, 32])
        ints = [net.add_input(n, "int32", [3]) for n in ("sl", "cl", "hcl")]
        tables = net.add_input("bt", "int32", [3, 4])
        codes = net.add_input("pool8", "uint8", [2, 12, 2, 2, 8, 16])
        floats = net.add_input("pool", "float16", [2, 12, 2, 2, 8, 16])
        scale = net.add_input("s", "float32", [2])
        kw = dict(layer_idx=0, num_heads=4, num_kv_heads=2, head_dim=16, tokens_per_block=8)
        out = gpt_attention(q, k, v, codes, tables, *ints, kv_cache_scale=scale, **kw)
        assert out.dtype == "float16"
        with pytest.raises(ValueError, match="1-byte codes"):
            gpt_attention(q, k, v, floats, tables, *ints, kv_cache_scale=scale, **kw)
        with pytest.raises(ValueError, match="dtype mismatch"):
            gpt_attention(q, k, v, codes, tables, *ints, **kw)
        bad = net.add_input("s1", "float32", [1])
        with pytest.raises(ValueError, match=r"float32 \[2\]"):
            gpt_attention(q, k, v, codes, tables, *ints, kv_cache_scale=bad, **kw)


@pytest.mark.parametrize("algo", ALGOS)
def test_varlen_gather_dequantizes_the_rows_it_packs(algo):
    # the mixed step's gather of cached rows runs on any device
    gen = torch.Generator().manual_seed(5)
    tpb, lengths = 4, [5, 8, 1]
    scale = torch.tensor([0.5, 0.25])
    cache = code_pool((20, 2, 3, tpb, 8), algo, scale, gen)
    tables = torch.randperm(20, generator=gen)[:9].view(3, 3).int()
    ids, rows, _ = attention_cuda._past_rows(tables, torch.tensor(lengths), tpb, torch.device("cpu"))
    keys, values = attention_cuda._gather(cache, ids, rows, scale, torch.bfloat16)
    codes_k, codes_v = attention_cuda._gather(cache, ids, rows)
    assert keys.dtype == torch.bfloat16
    assert torch.equal(keys, dequantize_kv(codes_k, scale[0], torch.bfloat16))
    assert torch.equal(values, dequantize_kv(codes_v, scale[1], torch.bfloat16))


# ---- CUDA against the reference ------------------------------------------------------------

needs_kernels = pytest.mark.skipif(not kernels.cuda_kernels_available(),
                                   reason="tensorrt_llm.bindings has no CUDA kernels: build with "
                                          "`python build_wheel.py -a native -s -i`")


def fp8_ok():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def needs(algo):
    if algo == "FP8" and not fp8_ok():
        pytest.skip("FP8 KV cache needs sm_89 or newer")


def seeded():
    seed = int.from_bytes(os.urandom(4), "little")
    return seed, torch.Generator().manual_seed(seed)


def assert_codes_close(ours, theirs, scale, algo, msg):
    """Written codes: almost all equal; the rest one step apart (the CUDA path rounds the rotated
    K once more, to the activation dtype, at another point than the reference)."""
    same = (ours.view(torch.uint8) == theirs.view(torch.uint8)).float().mean()
    assert float(same) >= 0.99, msg
    a, b = dequantized(ours, scale), dequantized(theirs, scale)
    step = scale.view(2, 1, 1, 1).to(a.device) * (2.0 ** -9 if algo == "FP8" else 1.0)
    rel = 2.0 ** -3 if algo == "FP8" else 0.0
    kv_dim = a.dim() - 4
    step = step.view(2, *([1] * (a.dim() - kv_dim - 1)))
    assert bool(((a - b).abs() <= rel * torch.maximum(a.abs(), b.abs()) + step * 1.01).all()), msg


# A decode kernel on codes rounds P and the converted K/V to float16 for its MMAs, and the
# reference works in float32 over the same dequantized values: a few float16 units of the output.
QUANT_TOL = {torch.float16: (4e-3, 4e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def assert_out_close(out, ref, dtype, msg):
    rtol, atol = QUANT_TOL[dtype]
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), rtol=rtol, atol=atol,
                               msg=lambda m: f"{msg}\n{m}")


@pytest.mark.gpu
@needs_kernels
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("batch", [1, 3, 32, "2.5 an SM", 512])
@pytest.mark.parametrize("heads", [(32, 8, 128), (9, 3, 64), (8, 1, 128)], ids=lambda h: "h{}kv{}d{}".format(*h))
def test_decode_kernel_reads_codes(batch, heads, algo, dtype):
    needs(algo)
    seed, gen = seeded()
    num_heads, kv_heads, head_dim = heads
    # 2.5 (sequence, KV head) blocks a multiprocessor: the four-warp kernel's three-block instance
    if batch == "2.5 an SM":
        batch = 5 * torch.cuda.get_device_properties(0).multi_processor_count // (2 * kv_heads)
    tpb, max_len = 16, (700 if batch <= 3 else 90)
    lengths = torch.randint(1, max_len + 1, (batch,), generator=gen).to(torch.int32)
    lengths[0] = max_len
    max_blocks = -(-max_len // tpb) + 1
    num_blocks = batch * max_blocks + 2
    tables = torch.randperm(num_blocks, generator=gen)[:batch * max_blocks].view(batch, max_blocks).to(torch.int32)
    scale = torch.tensor([0.015, 0.011])
    cache = code_pool((num_blocks, 2, kv_heads, tpb, head_dim), algo, scale, gen)
    q = torch.randn(batch, num_heads, head_dim, generator=gen).to(dtype)
    softmax_scale = 1 / math.sqrt(head_dim)
    dev = [x.cuda() for x in (q, cache, tables, lengths, scale)]
    out = attention_cuda.decode_attention_cuda(dev[0], dev[1], dev[2], dev[3], softmax_scale, kv_scale=dev[4])
    ref = reference.decode_attention(q.float(), dequantized(cache, scale), tables, lengths, softmax_scale)
    assert_out_close(out, ref.to(dtype), dtype, f"seed={seed}")



@pytest.mark.gpu
@needs_kernels
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("batch", [1, 7, 64, 512])
def test_paged_write_quantizes_as_the_reference(batch, algo, dtype):
    needs(algo)
    seed, gen = seeded()
    kv_heads, head_dim, tpb = 8, 128, 16
    step = step_inputs([(int(p), int(n)) for p, n in zip(torch.randint(0, 40, (batch,), generator=gen),
                                                      torch.randint(1, 6, (batch,), generator=gen))],
                       kv_heads, kv_heads, head_dim, tpb, dtype, gen, "cuda")
    scale = torch.tensor([0.01, 0.02], device="cuda")
    k = step["qkv"][:, kv_heads * head_dim:2 * kv_heads * head_dim].view(-1, kv_heads, head_dim)
    v = step["qkv"][:, 2 * kv_heads * head_dim:].view(-1, kv_heads, head_dim)
    storage = KV_CACHE_STORAGE[algo]
    ours = torch.zeros(step["num_blocks"], 2, kv_heads, tpb, head_dim, dtype=storage, device="cuda")
    cu = torch.zeros(batch + 1, dtype=torch.int32, device="cuda")
    cu[1:] = torch.cumsum(step["new"], 0)
    past = step["lengths"] - step["new"]
    attention_cuda.paged_kv_write_cuda_(k, v, ours, step["tables"], cu, past, scale)
    float_cache = torch.zeros(ours.shape, dtype=torch.float32, device="cuda")
    reference.paged_kv_write_(k.float(), v.float(), float_cache, step["tables"], cu, past)
    theirs = quantize_kv(float_cache, scale.view(1, 2, 1, 1, 1), algo).view(storage)
    assert torch.equal(ours, theirs), f"seed={seed}"


# (cached past, new tokens) of a step: decode rows, fresh prompts, chunks over a cached past.
STEPS = {
    "decode": [(37, 1), (5, 1), (64, 1), (0, 1), (130, 1)],
    "prompts": [(0, 23), (0, 7), (0, 64), (0, 2)],
    "decode+chunks": [(15, 1), (100, 1), (16, 9), (13, 40), (130, 17), (0, 30)],
}


@pytest.mark.gpu
@needs_kernels
@pytest.mark.parametrize("dtype", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("rotary", [False, True], ids=["plain", "rope"])
@pytest.mark.parametrize("scenario", list(STEPS))
@pytest.mark.parametrize("heads", [(32, 8, 128), (4, 1, 64)], ids=lambda h: "h{}kv{}d{}".format(*h))
def test_gpt_attention_cuda_matches_reference(heads, scenario, rotary, algo, dtype, monkeypatch):
    needs(algo)
    seed, gen = seeded()
    num_heads, kv_heads, head_dim = heads
    tpb = 16
    step = step_inputs(STEPS[scenario], num_heads, kv_heads, head_dim, tpb, dtype, gen, "cuda")
    amax = torch.tensor([3.5, 4.0])
    scale = kv_cache_scale_from_amax(amax, algo).cuda()
    pool = code_pool((2, step["num_blocks"], 2, kv_heads, tpb, head_dim), algo, scale.cpu(), gen).cuda()
    cos_sin = rope_cos_sin_cache(256, head_dim, 10000.0).cuda() if rotary else None
    ref_pool = pool.clone()
    ref = run(gpt_attention_reference, step, ref_pool, num_heads, kv_heads, head_dim, tpb, scale, cos_sin)

    def reference_taken(*args, **kwargs):
        raise AssertionError("gpt_attention_cuda took the reference path")
    monkeypatch.setattr(attention_cuda, "gpt_attention_reference", reference_taken)
    out = run(attention_cuda.gpt_attention_cuda, step, pool, num_heads, kv_heads, head_dim, tpb, scale, cos_sin)
    msg = f"seed={seed} scenario={scenario}"
    assert_codes_close(pool[1], ref_pool[1], scale, algo, msg)
    assert torch.equal(pool[0], ref_pool[0]), msg
    rtol, atol = QUANT_TOL[dtype]
    # rows whose codes the two paths rounded differently move the output by about a code step
    torch.testing.assert_close(out.float().cpu(), ref.float().cpu(), rtol=2 * rtol, atol=2 * atol,
                               msg=lambda m: f"{msg}\n{m}")


@pytest.mark.gpu
@needs_kernels
@pytest.mark.parametrize("q_dtype,head_dim,scale_shape,message", [
    (torch.float32, 128, (2,), "tensor-core kernel only"),
    (torch.bfloat16, 256, (2,), "tensor-core kernel only"),
    (torch.bfloat16, 128, None, "needs kv_scale"),
    (torch.bfloat16, 128, (3,), r"kv_scale must have shape \[2\]"),
])
def test_decode_kernel_refuses_what_it_cannot_read(q_dtype, head_dim, scale_shape, message):
    q = torch.zeros(2, 8, head_dim, dtype=q_dtype, device="cuda")
    cache = torch.zeros(4, 2, 2, 16, head_dim, dtype=torch.uint8, device="cuda")
    tables = torch.zeros(2, 2, dtype=torch.int32, device="cuda")
    lengths = torch.ones(2, dtype=torch.int32, device="cuda")
    scale = None if scale_shape is None else torch.ones(scale_shape, device="cuda")
    with pytest.raises(ValueError, match=message):
        attention_cuda.decode_attention_cuda(q, cache, tables, lengths, 0.1, kv_scale=scale)
