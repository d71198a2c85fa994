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


def test_unknown_keys_and_uneven_pipeline_are_rejected():
    with pytest.raises(ValueError, match="unknown keys"):
        Mapping.from_dict({"tp_size": 1, "cp_size": 2})
    with pytest.raises(ValueError, match=r"pp_size \(2\) must divide the number of layers \(3\)"):
        Mapping(world_size=2, pp_size=2).pp_layers(3)
