"""gpt_attention's CUDA helpers that run on any device: the paged-cache gather of the mixed step, against
a per-position reference on random data."""
import pytest
import torch

from tensorrt_llm.ops.attention_cuda import _gather, _past_rows


@pytest.mark.parametrize("tpb, lengths", [(4, [5, 8, 1, 12]),   # ends inside and at block boundaries
                                          (4, [8, 4]),           # whole blocks only (no second gather)
                                          (16, [33, 7, 16])])
def test_gather_past_packs_each_sequence_rows(tpb, lengths):
    g = torch.Generator().manual_seed(len(lengths) * tpb)
    num_blocks, max_blocks = 40, 5
    cache = torch.randn(num_blocks, 2, 3, tpb, 8, generator=g)
    tables = torch.randperm(num_blocks, generator=g)[:len(lengths) * max_blocks].view(len(lengths), max_blocks)
    ids, rows, cu_k = _past_rows(tables.int(), torch.tensor(lengths), tpb, torch.device("cpu"))
    keys, values = _gather(cache, ids, rows)
    want = torch.stack([cache[tables[i, p // tpb], :, :, p % tpb] for i, n in enumerate(lengths) for p in range(n)])
    assert torch.equal(keys, want[:, 0]) and torch.equal(values, want[:, 1])
    assert cu_k.dtype == torch.int32 and cu_k.tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]
