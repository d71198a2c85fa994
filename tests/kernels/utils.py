"""Helpers of the kernel tests."""
import torch

DTYPES = [torch.float32, torch.float16, torch.bfloat16]

# Per-dtype (rtol, atol) for a kernel against its reference: about two units in the last place
# of the storage type (the kernel and the reference round at slightly different points).
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype = None, msg: str = ""):
    rtol, atol = TOLERANCES[dtype or expected.dtype]
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), rtol=rtol, atol=atol,
                               msg=lambda m: f"{msg}\n{m}" if msg else m)


def make_paged_metadata(seq_new, past, tokens_per_block, num_blocks, generator, device="cpu"):
    """block_tables (distinct random blocks per sequence), cu_seqlens, past_lengths for a batch."""
    batch = len(seq_new)
    needed = [-(-(p + n) // tokens_per_block) for p, n in zip(past, seq_new)]
    max_blocks = max(needed + [1])
    perm = torch.randperm(num_blocks, generator=generator)
    assert sum(needed) <= num_blocks
    tables = torch.full((batch, max_blocks), -1, dtype=torch.int32)
    used = 0
    for b, n in enumerate(needed):
        tables[b, :n] = perm[used:used + n].to(torch.int32)
        used += n
    cu = torch.zeros(batch + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(seq_new, dtype=torch.int32), 0)
    return (tables.to(device), cu.to(device), torch.tensor(past, dtype=torch.int32, device=device))
