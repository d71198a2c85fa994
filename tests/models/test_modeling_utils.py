import json

import pytest
import torch

from tensorrt_llm.mapping import Mapping
from tensorrt_llm.models.modeling_utils import (
    PretrainedConfig,
    load_checkpoint_weights,
    pad_vocab_size,
    save_checkpoint,
)

BASE = dict(architecture="LlamaForCausalLM", dtype="float16", num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=2, hidden_size=64, intermediate_size=96,
            vocab_size=101)


def make(**overrides) -> PretrainedConfig:
    d = dict(BASE, **overrides)
    if isinstance(d.get("mapping"), dict):
        d["mapping"] = Mapping.from_dict(d["mapping"])
    return PretrainedConfig(**d)


def test_defaults_and_derived_fields():
    c = make()
    assert c.head_size == 8 and c.rotary_dim == 8
    assert c.logits_dtype == "float32" and c.position_embedding_type == "rope_gpt_neox"
    assert c.quantization == {"quant_algo": None}
    assert c.mapping == Mapping()
    assert c.torch_dtype == torch.float16
    assert make(num_key_value_heads=None).num_key_value_heads == 8
    assert make(rotary_pct=0.5).rotary_dim == 4


def test_dict_and_json_round_trip_keeps_extra_keys(tmp_path):
    d = dict(BASE, rotary_scaling={"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192},
             mapping={"world_size": 2, "tp_size": 2, "pp_size": 1},
             share_embedding_table=True, some_future_flag={"a": [1, 2]})
    c = PretrainedConfig.from_dict(d)
    assert c.extra == {"some_future_flag": {"a": [1, 2]}}
    assert c.mapping == Mapping(world_size=2, tp_size=2)
    out = c.to_dict()
    assert out["mapping"] == {"world_size": 2, "tp_size": 2, "pp_size": 1}  # no rank
    assert out["some_future_flag"] == {"a": [1, 2]} and "extra" not in out
    assert {k: out[k] for k in d} == d
    c.to_json_file(tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text()) == out
    assert PretrainedConfig.from_json_file(tmp_path / "c.json").to_dict() == out


def test_set_rank_and_from_checkpoint(tmp_path):
    c = make(mapping={"world_size": 2, "tp_size": 2})
    c.set_rank(1)
    assert c.mapping.rank == 1 and c.mapping.tp_rank == 1
    c.to_json_file(tmp_path / "config.json")
    assert PretrainedConfig.from_checkpoint(tmp_path, rank=1).mapping == Mapping(2, 1, 2)
    assert PretrainedConfig.from_checkpoint(tmp_path).mapping.rank == 0
    with pytest.raises(ValueError, match="rank must be in"):
        PretrainedConfig.from_checkpoint(tmp_path, rank=2)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        PretrainedConfig.from_checkpoint(tmp_path / "missing")


def test_vocab_padding():
    assert pad_vocab_size(101, 1) == 101
    assert pad_vocab_size(101, 2) == 102
    assert pad_vocab_size(100, 4) == 100
    assert make(mapping={"world_size": 2, "tp_size": 2}).vocab_size_padded == 102


@pytest.mark.parametrize("overrides, message", [
    (dict(architecture="GPT2LMHeadModel"), "unknown architecture 'GPT2LMHeadModel'"),
    (dict(dtype="float64"), "dtype must be one of"),
    (dict(logits_dtype="int8"), "logits_dtype must be one of"),
    (dict(hidden_size=60), r"num_attention_heads \(8\) must divide hidden_size \(60\)"),
    (dict(num_key_value_heads=3), r"num_key_value_heads \(3\) must divide num_attention_heads"),
    (dict(num_hidden_layers=0), "num_hidden_layers must be a positive integer"),
    (dict(vocab_size=10.5), "vocab_size must be a positive integer"),
    (dict(head_size=-1), "head_size must be a positive integer"),
    (dict(position_embedding_type="rope"), "position_embedding_type must be one of"),
    (dict(hidden_act="swiglu"), "hidden_act must be one of"),
    (dict(norm_epsilon=0.0), "norm_epsilon must be > 0"),
    (dict(rotary_base=-1.0), "rotary_base must be > 0"),
    (dict(rotary_pct=1.5), r"rotary_pct must be in \(0, 1\]"),
    (dict(rotary_pct=0.3), "must be an even integer"),
    (dict(rotary_scaling={"type": "yarn", "factor": 2.0}), "rotary_scaling must be None or"),
    (dict(rotary_scaling={"type": "linear", "factor": 2.0, "low_freq_factor": 1.0}),
     "needs exactly the keys"),
    (dict(rotary_scaling={"type": "linear", "factor": 0}), "factor must be > 0"),
    (dict(quantization={"quant_algo": "W8A8_SQ_PER_CHANNEL"}), "W8A8_SQ_PER_CHANNEL is not supported by this project"),
    (dict(architecture="GPTForCausalLM", quantization={"quant_algo": None, "kv_cache_quant_algo": "INT8"}),
     "quantized checkpoints of GPTForCausalLM are not supported"),
    (dict(quantization={"quant_algo": "W4A16", "group_size": 48}), "group_size 48 is not supported"),
    (dict(architecture="GPTForCausalLM", quantization={"quant_algo": "W8A16"}),
     "quantized checkpoints of GPTForCausalLM are not supported"),
    (dict(mapping={"world_size": 3, "tp_size": 3}),
     r"tp_size \(3\) must divide num_attention_heads \(8\); the tp sizes that split this model: 1, 2, 4, 8$"),
    (dict(num_attention_heads=12, num_key_value_heads=4, hidden_size=96, mapping={"world_size": 6, "tp_size": 6}),
     r"tp_size \(6\) must divide num_key_value_heads \(4\) \(or be a multiple of it\); "
     r"the tp sizes that split this model: 1, 2, 4, 12$"),
    (dict(num_key_value_heads=8, intermediate_size=100, mapping={"world_size": 8, "tp_size": 8}),
     r"tp_size \(8\) must divide intermediate_size \(100\)"),
    (dict(mapping={"world_size": 4, "tp_size": 1, "pp_size": 4}),
     r"pp_size \(4\) must not exceed the number of layers \(2\): every stage runs at least one layer$"),
    (dict(mapping={"world_size": 2, "pp_size": 2, "pp_partition": [2, 1]}),
     r"^PretrainedConfig: pp_partition \[2, 1\] sums to 3, not the number of layers \(2\)$"),
    (dict(extra={"dtype": "float32"}), r"extra keys \['dtype'\] clash"),
])
def test_invalid_configs_are_rejected(overrides, message):
    with pytest.raises(ValueError, match=message):
        make(**overrides)


def test_a_pipeline_partition_round_trips_through_config_json_and_sizes_each_stages_kv_cache():
    from tensorrt_llm.kv_cache_layout import KVCacheLayout
    c = make(num_hidden_layers=5, mapping={"world_size": 4, "tp_size": 2, "pp_size": 2, "pp_partition": [4, 1]})
    d = c.to_dict()
    assert d["mapping"] == {"world_size": 4, "tp_size": 2, "pp_size": 2, "pp_partition": [4, 1]}
    assert PretrainedConfig.from_dict(d).mapping == c.mapping.with_rank(0)
    assert [KVCacheLayout.of_engine(d, 8, rank=r).num_layers for r in range(4)] == [4, 4, 1, 1]
    assert KVCacheLayout.of_engine(d, 8).num_layers == 4  # the largest stage's pool
    # A config without the key (every one written before it existed): the even split, unchanged.
    old = make(num_hidden_layers=4, mapping={"world_size": 2, "pp_size": 2}).to_dict()
    assert "pp_partition" not in old["mapping"] and PretrainedConfig.from_dict(old).to_dict() == old
    assert [KVCacheLayout.of_engine(old, 8, rank=r).num_layers for r in range(2)] == [2, 2]


def test_tp_size_over_the_kv_heads_replicates_them():
    # 8 query heads over 2 KV heads: 4 or 8 ranks each hold one KV head, shared by 2 or 4 ranks.
    for tp in (4, 8):
        c = make(mapping={"world_size": tp, "tp_size": tp})
        assert c.tp_size_fits(tp)


def test_explicit_head_size_need_not_divide_hidden():
    c = make(hidden_size=60, head_size=16)
    assert c.head_size == 16


def test_missing_required_keys_are_named():
    d = dict(BASE)
    del d["vocab_size"], d["dtype"]
    with pytest.raises(ValueError, match=r"missing required keys \['dtype', 'vocab_size'\]"):
        PretrainedConfig.from_dict(d)


def test_checkpoint_weights_round_trip(tmp_path):
    c = make(mapping={"world_size": 2, "tp_size": 2})
    ranks = [{"a": torch.randn(3, 4).half(), "b": torch.arange(5, dtype=torch.int32)},
             {"a": torch.randn(4, 3).half().t(), "b": torch.arange(2, dtype=torch.int32)}]
    paths = save_checkpoint(tmp_path, c, iter(ranks))
    assert sorted(p.name for p in paths) == ["config.json", "rank0.safetensors", "rank1.safetensors"]
    assert PretrainedConfig.from_checkpoint(tmp_path).to_dict() == c.to_dict()
    for rank, expected in enumerate(ranks):
        got = load_checkpoint_weights(tmp_path, rank)
        assert got.keys() == expected.keys()
        for name in expected:
            assert torch.equal(got[name], expected[name])
    with pytest.raises(FileNotFoundError, match="no rank2.safetensors"):
        load_checkpoint_weights(tmp_path, 2)


def test_save_checkpoint_checks_rank_count_and_dtype(tmp_path):
    c = make(mapping={"world_size": 2, "tp_size": 2})
    w = {"a": torch.zeros(2, dtype=torch.float16)}
    with pytest.raises(ValueError, match="weights for 1 ranks, world_size is 2"):
        save_checkpoint(tmp_path, c, [w])
    with pytest.raises(ValueError, match=r"more weight sets than world_size \(2\)"):
        save_checkpoint(tmp_path, c, [w, w, w])
    with pytest.raises(ValueError, match="rank 0 weight a is torch.float32, config dtype is float16"):
        save_checkpoint(tmp_path, c, [{"a": torch.zeros(2)}, w])
