"""The converters' shared parts: the one tensor-parallel split by weight name, and how the
converter modules are laid out (one per model, no private names taken from another)."""
import ast
from pathlib import Path

import pytest
import torch

from tensorrt_llm.errors import ConfigError
from tensorrt_llm.mapping import Mapping
from tensorrt_llm.models import PretrainedConfig
from tensorrt_llm.models.convert_utils import rank_weights, shard

MODELS = Path(__file__).resolve().parents[2] / "tensorrt_llm" / "models"
H, D, HEADS, KV_HEADS, INTER, VOCAB = 16, 2, 8, 4, 24, 30


def config(tp_size: int) -> PretrainedConfig:
    return PretrainedConfig(architecture="LlamaForCausalLM", dtype="float16", num_hidden_layers=1,
                            num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, hidden_size=H,
                            intermediate_size=INTER, vocab_size=VOCAB, mapping=Mapping(world_size=tp_size,
                                                                                      tp_size=tp_size))


def whole() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"transformer.vocab_embedding.weight": (VOCAB, H), "transformer.layers.0.input_layernorm.weight": (H,),
              "transformer.layers.0.attention.qkv.weight": ((HEADS + 2 * KV_HEADS) * D, H),
              "transformer.layers.0.attention.qkv.bias": ((HEADS + 2 * KV_HEADS) * D,),
              "transformer.layers.0.attention.dense.weight": (H, HEADS * D),
              "transformer.layers.0.attention.dense.bias": (H,),
              "transformer.layers.0.mlp.gate.weight": (INTER, H), "transformer.layers.0.mlp.fc.weight": (INTER, H),
              "transformer.layers.0.mlp.fc.bias": (INTER,), "transformer.layers.0.mlp.proj.weight": (H, INTER),
              "transformer.layers.0.mlp.proj.bias": (H,), "lm_head.weight": (VOCAB, H), "lm_head.bias": (VOCAB,)}
    return {name: torch.randn(shape, generator=g) for name, shape in shapes.items()}


@pytest.mark.parametrize("tp_size", [1, 2, 4])
def test_the_ranks_together_hold_each_weight_once(tp_size):
    cfg, weights = config(tp_size), whole()
    ranks = [rank_weights(weights.items(), cfg, cfg.mapping.with_rank(r)) for r in range(tp_size)]
    padded = cfg.vocab_size_padded
    q, kv = HEADS * D, KV_HEADS * D
    for name, w in weights.items():
        parts = [r[name] for r in ranks]
        assert all(p.dtype == torch.float16 and p.is_contiguous() for p in parts)
        w = w.half()
        if ".qkv." in name:  # each rank: its q rows, then its k rows, then its v rows
            cut = [p.split([q // tp_size, kv // tp_size, kv // tp_size]) for p in parts]
            joined = torch.cat([torch.cat([c[i] for c in cut]) for i in range(3)])
        elif name.endswith(("dense.weight", "proj.weight")):
            joined = torch.cat(parts, dim=1)
        elif ".mlp.gate." in name or ".mlp.fc." in name or name.startswith("lm_head.") or (
                "vocab_embedding" in name and tp_size > 1):  # vocabulary-parallel tables
            joined = torch.cat(parts)
            if name.startswith("lm_head.") or "vocab_embedding" in name:
                assert joined.shape[0] == padded and not joined[VOCAB:].any()
                joined = joined[:VOCAB]
        else:
            assert all(torch.equal(p, w) for p in parts), name  # whole on every rank
            continue
        assert torch.equal(joined, w), name


def test_a_split_weight_never_keeps_its_source_alive():
    t = torch.randn(INTER, H)
    part = shard("transformer.layers.0.mlp.fc.weight", t, config(2), config(2).mapping.with_rank(1))
    assert part.untyped_storage().nbytes() == part.numel() * part.element_size()


def test_a_mapping_that_is_not_the_configs_is_refused():
    with pytest.raises(ConfigError, match="does not match the config"):
        rank_weights(whole().items(), config(2), Mapping(world_size=4, tp_size=4))
    with pytest.raises(ConfigError, match="does not match the config"):
        rank_weights(whole().items(), config(2), Mapping(world_size=2, tp_size=1, pp_size=2))


def test_tp_over_the_kv_heads_gives_each_rank_the_kv_head_its_queries_read():
    # 8 query heads, 4 KV heads, 8 ranks: rank r holds query head r and KV head r // 2.
    cfg, weights = config(8), whole()
    qkv = weights["transformer.layers.0.attention.qkv.weight"].half()
    q, k, v = qkv.split([HEADS * D, KV_HEADS * D, KV_HEADS * D])
    for r in range(8):
        part = rank_weights(weights.items(), cfg, cfg.mapping.with_rank(r))["transformer.layers.0.attention.qkv.weight"]
        kv_head = slice((r // 2) * D, (r // 2 + 1) * D)
        assert torch.equal(part, torch.cat([q[r * D:(r + 1) * D], k[kv_head], v[kv_head]]))


def test_pipeline_stages_hold_their_layers_renumbered():
    weights = whole()
    weights["transformer.layers.1.input_layernorm.weight"] = torch.randn(H)
    weights["transformer.ln_f.weight"] = torch.randn(H)
    cfg = PretrainedConfig(architecture="LlamaForCausalLM", dtype="float16", num_hidden_layers=2,
                           num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, hidden_size=H,
                           intermediate_size=INTER, vocab_size=VOCAB,
                           mapping=Mapping(world_size=2, tp_size=1, pp_size=2))
    first, last = (rank_weights(weights.items(), cfg, cfg.mapping.with_rank(r)) for r in (0, 1))
    assert "transformer.vocab_embedding.weight" in first and "lm_head.weight" not in first
    assert "transformer.ln_f.weight" not in first and "transformer.layers.1.input_layernorm.weight" not in first
    assert torch.equal(last["transformer.layers.0.input_layernorm.weight"],
                       weights["transformer.layers.1.input_layernorm.weight"].half())
    assert "transformer.vocab_embedding.weight" not in last and "lm_head.weight" in last
    assert "transformer.ln_f.weight" in last and not any(".attention." in n for n in last if ".0." not in n)


def test_one_converter_module_per_model_and_no_private_names_taken_from_another_module():
    packages = sorted(p for p in MODELS.iterdir() if (p / "__init__.py").is_file())
    for package in packages:
        modules = {p.name for p in package.glob("*.py")} - {"__init__.py"}
        assert modules <= {"convert.py", "model.py"} and "convert.py" in modules, (package.name, modules)
    for path in MODELS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.relative_to(MODELS)} imports {private} from {node.module}"
