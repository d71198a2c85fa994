"""Fuzzing what a converter or trtllm-build reads: GGUF headers and a checkpoint's config.json.

Property: the conversion (or config load) succeeds or raises the project's own error; never
another exception, a hang, or a file written outside the output folder.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tensorrt_llm.models.llama import convert
from tensorrt_llm.models.modeling_utils import PretrainedConfig

from .harness import fuzz_settings, outcome

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 16, 2, 1, 24, 40, 1


def write_tiny_gguf(path: Path) -> bytes:
    """A llama GGUF as llama.cpp writes one (float32 tensors), small enough to mutate per case."""
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(64)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    rng = np.random.default_rng(0)
    head = HIDDEN // HEADS
    shapes = {"token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,),
              "output.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        shapes.update({f"blk.{i}.attn_norm.weight": (HIDDEN,), f"blk.{i}.ffn_norm.weight": (HIDDEN,),
                       f"blk.{i}.attn_q.weight": (HIDDEN, HIDDEN),
                       f"blk.{i}.attn_k.weight": (KV_HEADS * head, HIDDEN),
                       f"blk.{i}.attn_v.weight": (KV_HEADS * head, HIDDEN),
                       f"blk.{i}.attn_output.weight": (HIDDEN, HIDDEN),
                       f"blk.{i}.ffn_gate.weight": (FFN, HIDDEN), f"blk.{i}.ffn_up.weight": (FFN, HIDDEN),
                       f"blk.{i}.ffn_down.weight": (HIDDEN, FFN)})
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


class Blob(bytes):
    """The file's bytes, shown by their length in a failing case's report."""

    def __repr__(self):
        return f"<{len(self)} bytes>"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Blob:
    return Blob(write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf"))


def convert_gguf(path: Path):
    reader = convert.open_gguf(path)
    config = convert.config_from_gguf(path, "float32", reader=reader)
    return convert.load_weights_from_gguf(path, config, reader=reader)


def test_the_tiny_gguf_converts(tiny_gguf, tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(tiny_gguf)
    weights = convert_gguf(path)
    assert weights["transformer.vocab_embedding.weight"].shape == (VOCAB, HIDDEN)


# Interesting 8-byte values for the counts and lengths a GGUF header is made of.
INTERESTING = [0, 1, 2, 3, 7, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**64 - 1]
mutation = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 4096)),
    st.tuples(st.just("byte"), st.integers(0, 4096), st.integers(0, 255)),
    st.tuples(st.just("u64"), st.integers(0, 4096), st.sampled_from(INTERESTING)),
    st.tuples(st.just("u32"), st.integers(0, 4096), st.sampled_from(INTERESTING[:9])),
)


def mutate(data: bytes, mutations) -> bytes:
    buf = bytearray(data)
    for m in mutations:
        kind, at = m[0], min(m[1], len(buf))
        if kind == "truncate":
            buf = buf[:at]
        elif kind == "byte" and at < len(buf):
            buf[at] = m[2]
        elif kind == "u64" and at + 8 <= len(buf):
            buf[at:at + 8] = struct.pack("<Q", m[2])
        elif kind == "u32" and at + 4 <= len(buf):
            buf[at:at + 4] = struct.pack("<I", m[2] & 0xFFFFFFFF)
    return bytes(buf)


@fuzz_settings(examples=3000)
@given(mutations=st.lists(mutation, min_size=1, max_size=4))
@example(mutations=[("truncate", 24)])             # header cut inside the counts
@example(mutations=[("u64", 8, 2**63 - 1)])        # tensor count far beyond the file
@example(mutations=[("u64", 16, 2**64 - 1)])       # key/value count far beyond the file
# found by this fuzzer (they escaped as other exceptions): the regression corpus
@example(mutations=[("byte", 255, 0)])             # a head count of 0: ZeroDivisionError
@example(mutations=[("byte", 255, 17)])            # more heads than hidden units: ZeroDivisionError
@example(mutations=[("u64", 1231, 0)])             # a tensor dim of 0: torch.cat's RuntimeError
@example(mutations=[("byte", 1183, 1)])            # a q tensor of other dims: numpy's reshape error
def test_gguf_header_mutations_convert_or_raise_checkpoint_errors(tiny_gguf, tmp_path, mutations):
    path = tmp_path / "m.gguf"
    path.write_bytes(mutate(tiny_gguf, mutations))
    before = sorted(p.name for p in tmp_path.iterdir())
    outcome(lambda: convert_gguf(path), f"GGUF mutated by {mutations}")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=3),
                           max_leaves=6)


@pytest.fixture(scope="module")
def good_config(tiny_gguf, tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("cfg") / "m.gguf"
    path.write_bytes(tiny_gguf)
    return convert.config_from_gguf(path, "float32").to_dict()


@pytest.mark.parametrize("field, value", [("quantization", None), ("architecture", [])])
def test_found_config_values_are_config_errors(good_config, tmp_path, field, value):
    """Found by the fuzzer below: an AttributeError and a TypeError escaped for these."""
    (tmp_path / "config.json").write_text(json.dumps(dict(good_config, **{field: value})))
    assert outcome(lambda: PretrainedConfig.from_checkpoint(tmp_path), field).startswith("ConfigError")


@fuzz_settings(examples=3000)
@given(data=st.data())
def test_checkpoint_config_json_loads_or_raises_config_errors(good_config, tmp_path, data):
    kind = data.draw(st.sampled_from(["set", "delete", "whole", "text"]))
    config = json.loads(json.dumps(good_config))
    if kind == "set":
        key = data.draw(st.sampled_from(sorted(config) + ["mapping.tp_size", "mapping.world_size", "new_key"]))
        value = data.draw(json_values)
        if key.startswith("mapping."):
            config["mapping"][key.split(".")[1]] = value
        else:
            config[key] = value
        text = json.dumps(config)
    elif kind == "delete":
        config.pop(data.draw(st.sampled_from(sorted(config))))
        text = json.dumps(config)
    elif kind == "whole":
        text = json.dumps(data.draw(json_values))
    else:
        text = data.draw(st.text(max_size=40))
    (tmp_path / "config.json").write_text(text)
    outcome(lambda: PretrainedConfig.from_checkpoint(tmp_path), f"config.json = {text}")
