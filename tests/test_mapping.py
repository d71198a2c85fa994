import pytest

from tensorrt_llm.mapping import Mapping


def test_defaults_are_a_single_rank():
    m = Mapping()
    assert (m.world_size, m.rank, m.tp_size, m.pp_size, m.tp_rank, m.pp_rank) == (1, 0, 1, 1, 0, 0)
    assert m.is_first_pp_rank() and m.is_last_pp_rank()


def test_ranks_are_tensor_parallel_first():
    # world 6 = tp 3 x pp 2: ranks 0-2 are stage 0, ranks 3-5 stage 1.
    m = Mapping(world_size=6, rank=4, tp_size=3, pp_size=2)
    assert (m.tp_rank, m.pp_rank) == (1, 1)
    assert m.tp_group == [3, 4, 5]
    assert m.pp_group == [1, 4]
    assert not m.is_first_pp_rank() and m.is_last_pp_rank()
    assert m.pp_layers(8) == [4, 5, 6, 7]
    assert [Mapping(6, r, 3, 2).pp_layers(8) for r in (0, 2)] == [[0, 1, 2, 3]] * 2


def test_dict_round_trip_and_with_rank():
    m = Mapping(world_size=4, rank=3, tp_size=2, pp_size=2)
    assert m.to_dict() == {"world_size": 4, "rank": 3, "tp_size": 2, "pp_size": 2}
    assert Mapping.from_dict(m.to_dict()) == m
    assert Mapping.from_dict({"tp_size": 2}) == Mapping(world_size=2, tp_size=2)
    assert m.with_rank(1) == Mapping(4, 1, 2, 2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(world_size=2), r"world_size \(2\) must equal tp_size \* pp_size"),
    (dict(world_size=4, tp_size=2, pp_size=1), r"world_size \(4\) must equal"),
    (dict(world_size=2, tp_size=2, rank=2), r"rank must be in \[0, 2\)"),
    (dict(rank=-1), r"rank must be in"),
    (dict(world_size=0), "world_size must be a positive integer"),
    (dict(tp_size=1.5), "tp_size must be a positive integer"),
])
def test_invalid_mappings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Mapping(**kwargs)


def test_unknown_keys_and_too_many_stages_are_rejected():
    with pytest.raises(ValueError, match="unknown keys"):
        Mapping.from_dict({"tp_size": 1, "cp_size": 2})
    with pytest.raises(ValueError, match=r"pp_size \(4\) must not exceed the number of layers \(3\)"):
        Mapping(world_size=4, pp_size=4).pp_layers(3)


def test_without_a_partition_the_layers_split_evenly_the_first_stages_taking_the_remainder():
    assert [Mapping(4, r, 1, 4).pp_layers(8) for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [Mapping(2, r, 1, 2).pp_layers(5) for r in range(2)] == [[0, 1, 2], [3, 4]]
    assert Mapping(3, 0, 1, 3).stage_layer_counts(10) == [4, 3, 3]


def test_a_partition_gives_each_stage_its_layers():
    m = Mapping(world_size=4, rank=2, tp_size=2, pp_size=2, pp_partition=[17, 15])
    assert m.pp_layers(32) == list(range(17, 32))
    assert m.with_rank(1).pp_layers(32) == list(range(17))
    assert m.with_rank(1).pp_partition == [17, 15]
    assert Mapping(3, 1, 1, 3, pp_partition=(1, 3, 1)).pp_layers(5) == [1, 2, 3]


@pytest.mark.parametrize("partition, message", [
    ([16, 16, 0], r"pp_partition must be a list of positive integers"),
    ([16, -1], r"pp_partition must be a list of positive integers"),
    ("16,16", r"pp_partition must be a list of positive integers"),
    ([16.0, 16], r"pp_partition must be a list of positive integers"),
    ([True, 31], r"pp_partition must be a list of positive integers"),
    ([32], r"pp_partition \[32\] has 1 stage\(s\); pp_size is 2"),
    ([10, 10, 12], r"has 3 stage\(s\); pp_size is 2"),
])
def test_bad_partitions_are_refused_in_one_line(partition, message):
    with pytest.raises(ValueError, match=message) as e:
        Mapping(world_size=2, pp_size=2, pp_partition=partition)
    assert "\n" not in str(e.value)


def test_a_partition_must_sum_to_the_layer_count():
    with pytest.raises(ValueError, match=r"pp_partition \[17, 14\] sums to 31, not the number of layers \(32\)"):
        Mapping(2, 0, 1, 2, pp_partition=[17, 14]).pp_layers(32)


def test_dict_round_trip_with_and_without_a_partition():
    old = {"world_size": 2, "rank": 1, "tp_size": 1, "pp_size": 2}
    m = Mapping.from_dict(old)
    assert m.pp_partition is None and m.to_dict() == old  # no key added: old configs unchanged
    assert m.pp_layers(32) == list(range(16, 32))  # an old config's even split
    new = Mapping(4, 3, 2, 2, pp_partition=[17, 15])
    assert new.to_dict() == {"world_size": 4, "rank": 3, "tp_size": 2, "pp_size": 2, "pp_partition": [17, 15]}
    assert Mapping.from_dict(new.to_dict()) == new
    assert new != Mapping(4, 3, 2, 2)
    assert "pp_partition=[17, 15]" in repr(new)
    with pytest.raises(ValueError, match="has 1 stage"):
        Mapping.from_dict({"pp_size": 2, "pp_partition": [3]})


def shape(**kw):
    import transformers

    from tensorrt_llm.models.llama.convert import config_from_hf
    pp = kw.pop("pp_size", 2)
    return config_from_hf(transformers.LlamaConfig(**kw), dtype="bfloat16", mapping=Mapping(pp, 0, 1, pp))


LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8)
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)


def test_balanced_partitions_give_the_last_stage_fewer_layers_for_its_lm_head():
    from tensorrt_llm.models.modeling_utils import with_pp_partition
    eight_b = shape(**LLAMA_8B)
    # A layer: 218M weights; the LM head (128,256 x 4,096): 525M, ~2.4 layers.
    assert eight_b.decoder_layer_params == 218_103_808 and eight_b.lm_head_params == 525_336_576
    assert eight_b.balanced_pp_partition() == [17, 15]  # 17 vs 15 + 2.4 layers
    assert eight_b.balanced_pp_partition(4) == [9, 9, 8, 6]
    assert eight_b.balanced_pp_partition(1) == [32]
    # Tied embeddings: the last stage still multiplies by vocab x hidden every token (~8 layers here).
    assert shape(**SMOLLM2_135M).balanced_pp_partition() == [19, 11]
    assert shape(**dict(LLAMA_8B, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                        num_attention_heads=64)).balanced_pp_partition() == [41, 39]
    # A small head: the even split (an odd count's extra layer on the first stage).
    assert shape(**dict(LLAMA_8B, vocab_size=32, num_hidden_layers=5)).balanced_pp_partition() == [3, 2]
    # Every stage keeps a layer, however large the head.
    assert shape(**dict(LLAMA_8B, num_hidden_layers=4, vocab_size=10**7)).balanced_pp_partition(4) == [1, 1, 1, 1]
    # What a conversion records: the balanced split, or the one asked for (checked).
    assert with_pp_partition(eight_b).mapping.pp_partition == [17, 15]
    assert with_pp_partition(eight_b, [16, 16]).to_dict()["mapping"]["pp_partition"] == [16, 16]
    with pytest.raises(ValueError, match=r"pp_partition \[16, 15\] sums to 31, not the number of layers \(32\)"):
        with_pp_partition(eight_b, [16, 15])
    one = shape(pp_size=1, **LLAMA_8B)
    assert with_pp_partition(one) is one and "pp_partition" not in one.to_dict()["mapping"]
