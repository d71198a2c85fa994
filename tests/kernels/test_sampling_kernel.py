"""top_k_top_p_sample: its reference against the runtime's sampling_distribution (CPU), and the
CUDA kernel against the reference, token for token (GPU: `pytest -m gpu`). argmax_rows (greedy
decoding's kernel): torch.argmax's answer, NaN and ties included.

The kernel and the reference weigh tokens with the same integer masses, so they draw the same
token from the same uniform number. Only the masses' exp() may round differently on the two
sides (a few float32 units in the last place); a differing token is accepted only where that
rounding can move the result: the draw within that distance of an interval boundary, or the
top-p cut within it of the target (see rounding_explains).
"""
import itertools
import math

import pytest
import torch

from tensorrt_llm import kernels
from tensorrt_llm.kernels import reference
from tensorrt_llm.ops.launch import tensor_arg
from tensorrt_llm.runtime.sampling import (
    SamplingConfig,
    argmax_rows,
    choose,
    make_generator,
    sampling_distribution,
)

TEMPERATURES = [0.0, 0.7, 1.3]
TOP_KS = [0, 1, 5, 50, 1024]
TOP_PS = [1.0, 0.9, 0.5, 0.0]
GRID = list(itertools.product(TEMPERATURES, TOP_KS, TOP_PS))  # one row per combination
MASS_ONE = 2 ** reference.MASS_BITS


def row_params(combos, device="cpu"):
    """(temperature, top_k, top_p) tensors for a list of (temperature, top_k, top_p)."""
    temperature, top_k, top_p = zip(*combos)
    return (torch.tensor(temperature, dtype=torch.float32, device=device),
            torch.tensor(top_k, dtype=torch.int32, device=device),
            torch.tensor(top_p, dtype=torch.float32, device=device))


def configs_of(combos):
    return [SamplingConfig(end_id=0, temperature=t, top_k=k, top_p=p) for t, k, p in combos]


def random_logits(batch, vocab, seed, scale=2.0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, vocab, generator=gen) * scale


# ---- the reference against sampling_distribution (CPU) -----------------------------------

@pytest.mark.parametrize("vocab", [300, 1000])
def test_kept_set_is_the_support_of_sampling_distribution(vocab):
    logits = random_logits(len(GRID), vocab, seed=vocab)
    kept, _ = reference.top_k_top_p_masses(logits, *row_params(GRID))
    support = sampling_distribution(logits, configs_of(GRID)) > 0
    assert torch.equal(kept, support)
    sizes = kept.sum(dim=1)
    assert sizes.min() == 1 and sizes.max() == vocab and len(set(sizes.tolist())) > 10  # real cuts


@pytest.mark.parametrize("combo", [(1.0, 0, 1.0), (0.7, 50, 1.0), (1.3, 0, 0.9), (1.0, 5, 0.5), (0.7, 1024, 0.9)])
def test_stratified_draws_match_sampling_distribution(combo):
    """u = (j + 1/2) / N for j < N (exact in float32) hits every token about N * p times: within 1
    of it for exact masses, 2 allowing for the rounding of the float32 distribution."""
    n = 2 ** 13
    logits = random_logits(1, 400, seed=11)
    temperature, top_k, top_p = (t.expand(n) for t in row_params([combo]))
    uniform = (torch.arange(n, dtype=torch.float32) + 0.5) / n
    tokens = reference.top_k_top_p_sample(logits.expand(n, -1), temperature, top_k, top_p, uniform)
    counts = torch.bincount(tokens.long(), minlength=400).double()
    expected = n * sampling_distribution(logits, configs_of([combo]))[0].double()
    assert (counts[expected == 0] == 0).all()
    assert (counts - expected).abs().max() <= 2, (counts - expected).abs().max()


def test_ties_at_the_top_k_threshold_are_kept():
    logits = torch.tensor([[5.0, 4.0, 3.0, 3.0, 3.0, 1.0, 0.0, 3.0]])
    kept, _ = reference.top_k_top_p_masses(logits, *row_params([(1.0, 3, 1.0)]))
    assert kept[0].nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 7]
    assert torch.equal(kept, sampling_distribution(logits, SamplingConfig(end_id=0, top_k=3)) > 0)


def test_ties_at_the_top_p_threshold_are_kept():
    # probabilities 0.4, 0.2, 0.2, 0.2: the tied tokens each have 0.4 < 0.5 above them.
    logits = torch.tensor([[0.2, 0.4, 0.2, 0.2]]).log()
    kept, _ = reference.top_k_top_p_masses(logits, *row_params([(1.0, 0, 0.5)]))
    assert kept.all()
    assert (sampling_distribution(logits, SamplingConfig(end_id=0, top_p=0.5)) > 0).all()
    kept, _ = reference.top_k_top_p_masses(logits, *row_params([(1.0, 0, 0.4)]))
    assert kept[0].tolist() == [False, True, False, False]


def exact_boundary_case(device="cpu"):
    """Four tokens tied at the maximum (masses exactly 2**40 whatever exp() rounds) and -inf
    elsewhere: u = j / 4 is exactly the start of the j-th tied token's interval."""
    logits = torch.full((1, 1000), -math.inf)
    tied = [3, 10, 500, 999]
    logits[0, tied] = 2.5
    u = [0.0, 0.25 - 2 ** -24, 0.25, 0.5 - 2 ** -24, 0.5, 0.75, 1 - 2 ** -24]
    expected = [3, 3, 10, 10, 500, 999, 999]
    combos = [(1.0, 0, 1.0), (0.5, 4, 1.0), (2.0, 50, 0.9999)]  # every limit keeps all four
    n = len(u)
    rows = logits.expand(n * len(combos), -1).to(device)
    params = [t.repeat_interleave(n) for t in row_params(combos, device)]
    uniform = torch.tensor(u * len(combos), device=device)
    return rows, params, uniform, expected * len(combos)


def test_draws_on_exact_interval_boundaries():
    rows, params, uniform, expected = exact_boundary_case()
    assert reference.top_k_top_p_sample(rows, *params, uniform).tolist() == expected


def test_greedy_rows_take_the_lowest_index_among_maxima():
    logits = torch.tensor([[1.0, 7.0, 3.0, 7.0], [float("nan"), 0.5, 2.0, -1.0], [-0.0, 0.0, -1.0, -2.0]])
    for combo in [(0.0, 0, 1.0), (1.0, 1, 1.0), (0.0, 50, 0.5)]:
        params = row_params([combo] * 3)
        tokens = reference.top_k_top_p_sample(logits, *params, torch.rand(3))
        assert tokens.tolist() == [1, 2, 0]  # NaN counts as -inf; -0.0 equals +0.0
        assert torch.equal(tokens[:1].long(), logits[:1].argmax(dim=-1))


def test_infinite_logits():
    logits = torch.tensor([[-math.inf, 1.0, -math.inf, 0.0], [-math.inf] * 4, [1.0, math.inf, 3.0, math.inf]])
    kept, mass = reference.top_k_top_p_masses(logits, *row_params([(1.0, 0, 1.0)] * 3))
    assert mass[0, 0] == 0 and mass[0, 1] == MASS_ONE and 0 < mass[0, 3] < MASS_ONE
    # A row without a finite maximum spreads its mass evenly over the tokens at the maximum.
    assert mass[1].tolist() == [MASS_ONE] * 4 and mass[2].tolist() == [0, MASS_ONE, 0, MASS_ONE]
    draws = reference.top_k_top_p_sample(logits.repeat(64, 1), *row_params([(1.0, 0, 1.0)] * 192),
                                         torch.rand(192, generator=torch.Generator().manual_seed(0)))
    draws = draws.view(64, 3)
    assert set(draws[:, 0].tolist()) == {1, 3} and set(draws[:, 2].tolist()) == {1, 3}
    assert set(draws[:, 1].tolist()) == {0, 1, 2, 3}


def test_op_on_the_cpu_is_the_reference():
    logits = random_logits(len(GRID), 500, seed=3).to(torch.bfloat16)
    params = row_params(GRID)
    uniform = torch.rand(len(GRID), generator=torch.Generator().manual_seed(1))
    tokens = kernels.top_k_top_p_sample(logits, *params, uniform)
    assert tokens.dtype == torch.int32 and tokens.shape == (len(GRID),)
    assert torch.equal(tokens, reference.top_k_top_p_sample(logits, *params, uniform))
    torch.library.opcheck(torch.ops.trtllm.top_k_top_p_sample.default, (logits, *params, uniform))


def test_argmax_rows_on_the_cpu_is_torch_argmax():
    logits = random_logits(5, 300, seed=4)
    logits[1, [7, 9]] = float("nan")
    tokens = kernels.argmax_rows(logits)
    assert tokens.dtype == torch.int32 and torch.equal(tokens.long(), logits.argmax(dim=-1))
    torch.library.opcheck(torch.ops.trtllm.argmax_rows.default, (logits,))


def test_argmax_rows_into_a_buffer_advances_the_lengths_on_the_cpu():
    """out= and advance= (a greedy decode step's tokens and lengths) through the custom op."""
    logits = random_logits(5, 300, seed=5)
    out = torch.full((7,), -1, dtype=torch.int32)
    lengths = torch.arange(10, 17, dtype=torch.int32)
    got = kernels.argmax_rows(logits, out=out[:5], advance=lengths[:5])
    assert got.data_ptr() == out.data_ptr() and torch.equal(got.long(), logits.argmax(dim=-1))
    assert out[5:].tolist() == [-1, -1] and lengths.tolist() == [11, 12, 13, 14, 15, 15, 16]
    assert torch.equal(argmax_rows(logits, advance=lengths[:2]).long(), logits.argmax(dim=-1))
    assert lengths[:2].tolist() == [12, 13]
    torch.library.opcheck(torch.ops.trtllm.argmax_rows_into.default,
                          (out[:5].clone(), logits, lengths[:5].clone(), None, None))
    torch.library.opcheck(torch.ops.trtllm.argmax_rows_into.default, (out[:5].clone(), logits, None, None, None))
    # With a host row pair and its slot (a greedy graph's tokens for the host): row slot % 2, slot + 1.
    host, slot = torch.full((2, 6), -1, dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    torch.ops.trtllm.argmax_rows_into(out[:5], logits, None, host, slot)
    assert host[1, :5].tolist() == out[:5].tolist() and host[0].eq(-1).all() and slot.item() == 4
    torch.library.opcheck(torch.ops.trtllm.argmax_rows_into.default,
                          (out[:5].clone(), logits, lengths[:5].clone(), host.clone(), slot.clone()))


def test_compiled_module_checks_arguments_before_any_launch():
    if not kernels.bindings_available():
        pytest.fail("tensorrt_llm.bindings is not built: run `python build_wheel.py` first")

    def on_gpu(t):  # claims CUDA device 0; the checks below fail before any pointer is used
        return tensor_arg(t)[:4] + (0,)
    bindings = kernels.get_bindings()
    logits, out = torch.randn(3, 10), torch.empty(3, dtype=torch.int32)
    t, k, p = row_params([(1.0, 0, 1.0)] * 3)
    args = [on_gpu(x) for x in (out, logits, t, k, p, torch.rand(3))]
    bad_k = list(args)
    bad_k[3] = on_gpu(k.float())
    with pytest.raises(TypeError, match="top_k_top_p_sample: top_k must be one of {int32}"):
        bindings.top_k_top_p_sample(*bad_k, 0)
    bad_u = list(args)
    bad_u[5] = on_gpu(torch.rand(4))
    with pytest.raises(ValueError, match=r"top_k_top_p_sample: uniform must have shape \[3\]"):
        bindings.top_k_top_p_sample(*bad_u, 0)
    strided = list(args)
    strided[1] = on_gpu(torch.randn(10, 3).t())
    with pytest.raises(ValueError, match="logits must be contiguous in its last dimension"):
        bindings.top_k_top_p_sample(*strided, 0)


# ---- the CUDA kernel against the reference (GPU) -----------------------------------------

def mass_above(x, mass):
    """For each token of the row x [V], the mass of the tokens with a strictly larger logit."""
    values, order = x.sort(descending=True)
    ranked = mass[order]
    first_of_tie = torch.searchsorted(-values, -values)
    above = torch.empty_like(ranked)
    above[order] = (ranked.cumsum(0) - ranked)[first_of_tie]
    return above


def rounding_explains(logits, temperature, top_k, top_p, uniform, token) -> bool:
    """Whether `token` (drawn by the kernel for this one row) differs from the reference's only
    because of how exp() rounds the masses. Each mass may differ by a few float32 units in the
    last place (< 2**-21 of itself) plus 1 from the truncation; sums of them, and the top-p target
    and the draw derived from sums, move by at most E = 2**-20 of the row's mass + 2 per token."""
    one = torch.ones_like(top_p)
    kept, mass = reference.top_k_top_p_masses(logits, temperature, top_k, top_p)
    kept_by_k, _ = reference.top_k_top_p_masses(logits, temperature, top_k, one)  # top-p off
    kept, mass, kept_by_k = kept[0], mass[0], kept_by_k[0]
    if not kept_by_k[token]:
        return False  # top-k compares logits exactly: no rounding involved
    mass_k = torch.where(kept_by_k, mass, 0)
    slack = float(mass_k.sum()) * 2 ** -20 + 2 * mass.numel()
    p = float(top_p[0])
    if 0 < p < 1:
        target = max(1, math.floor(p * float(mass_k.sum())))
        above = mass_above(logits[0].float(), mass_k)
        if float(above[token]) >= target + slack:
            return False  # outside even the widest nucleus rounding allows
        if ((above[kept_by_k].double() - target).abs() <= slack).any():
            return True  # the cut itself is within rounding: the intervals after it may shift
    if not kept[token]:
        return False
    weights = torch.where(kept, mass, 0)
    ends = weights.cumsum(0)
    total = int(ends[-1])
    u = max(float(uniform[0]), 0.0)
    draw = min(int(u * total), total - 1)
    return int(ends[token]) - int(weights[token]) - slack <= draw < int(ends[token]) + slack


def assert_matches_reference(tokens, logits, temperature, top_k, top_p, uniform, what=""):
    """The kernel's tokens are the reference's, but for draws rounding_explains; returns how many
    differ."""
    expected = reference.top_k_top_p_sample(logits, temperature, top_k, top_p, uniform)
    assert tokens.dtype == torch.int32 and tokens.shape == expected.shape and tokens.is_cuda
    differ = (tokens != expected).nonzero().flatten().tolist()
    for b in differ:
        rows = slice(b, b + 1)
        assert rounding_explains(logits[rows], temperature[rows], top_k[rows], top_p[rows], uniform[rows],
                                 int(tokens[b])), (
            f"{what} row {b}: kernel drew {int(tokens[b])}, reference {int(expected[b])} (temperature "
            f"{float(temperature[b])}, top_k {int(top_k[b])}, top_p {float(top_p[b])}, u {float(uniform[b])})")
    return len(differ)


@pytest.fixture(scope="module")
def compiled():
    if not kernels.cuda_kernels_available():
        pytest.fail("tensorrt_llm.bindings has no CUDA kernels: build with `python build_wheel.py -a native -s -i`")


HARD_KINDS = 6


def make_hard(row, kind, gen):
    """Turn one row of logits [V] into hard case `kind`, in place: 0 ties at the maximum, 1 ties at
    the 5th, 50th and 1024th largest, 2 half of it -inf, 3 all -inf, 4 two values only, 5 three
    finite logits (fewer than most top_k)."""
    vocab = row.numel()
    if kind == 0:
        row[torch.randperm(vocab, generator=gen)[:7]] = row.max()
    elif kind == 1:
        ranked = row.sort(descending=True).values
        for k in (5, 50, min(1024, vocab - 1)):
            row[torch.randperm(vocab, generator=gen)[:3]] = ranked[k - 1]
    elif kind == 2:
        row[torch.randperm(vocab, generator=gen)[:vocab // 2]] = -math.inf
    elif kind == 3:
        row.fill_(-math.inf)
    elif kind == 4:
        row.copy_((torch.rand(vocab, generator=gen) < 0.5).float())
    else:
        row[torch.randperm(vocab, generator=gen)[:vocab - 3]] = -math.inf


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1000, 49152, 128256, 151936, 32003])
def test_kernel_matches_reference_over_the_parameter_grid(compiled, seed, vocab, dtype):
    gen = torch.Generator().manual_seed(seed)
    combos = GRID + GRID  # every combination on a random row, then on a hard row
    rows = len(combos)
    logits = torch.randn(rows, vocab, generator=gen) * (1 + 4 * torch.rand(rows, 1, generator=gen))
    for b in range(len(GRID), rows):
        make_hard(logits[b], (b + seed) % HARD_KINDS, gen)
    logits = logits.to(dtype).cuda()
    params = row_params(combos, "cuda")
    differ = 0
    for draw in range(4):
        uniform = torch.rand(rows, generator=gen).cuda()
        tokens = kernels.top_k_top_p_sample(logits, *params, uniform)
        differ += assert_matches_reference(tokens, logits, *params, uniform, f"seed={seed} draw {draw}")
    assert differ <= rows // 8, f"seed={seed}: {differ} draws differ, each within rounding, but that many"


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 2, 7, 33, 64])
def test_kernel_batch_sizes_and_strided_rows(compiled, seed, batch):
    gen = torch.Generator().manual_seed(seed)
    vocab = 151936
    combos = [GRID[i] for i in torch.randint(len(GRID), (batch,), generator=gen).tolist()]
    wide = torch.zeros(batch, vocab + 37, dtype=torch.bfloat16, device="cuda")
    logits = wide[:, 5:5 + vocab]  # a row stride longer than the row, rows not 16-byte aligned
    logits.copy_((torch.randn(batch, vocab, generator=gen) * 3).to(torch.bfloat16))
    uniform = torch.rand(batch, generator=gen).cuda()
    params = row_params(combos, "cuda")
    tokens = kernels.top_k_top_p_sample(logits, *params, uniform)
    assert_matches_reference(tokens, logits, *params, uniform, f"seed={seed}")


@pytest.mark.gpu
def test_kernel_draws_on_exact_interval_boundaries(compiled):
    rows, params, uniform, expected = exact_boundary_case("cuda")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        tokens = kernels.top_k_top_p_sample(rows.to(dtype), *params, uniform)
        assert tokens.tolist() == expected, dtype


@pytest.mark.gpu
def test_kernel_greedy_rows_equal_torch_argmax(compiled, seed):
    """Greedy rows pick the lowest index among equal maxima, as torch.argmax does on CUDA."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(24, 49152, generator=gen)
    for b in range(24):
        make_hard(logits[b], 0 if b % 3 == 0 else 4, gen)  # ties at the maximum, or two values only
    logits = logits.to(torch.bfloat16).cuda()
    for combo in [(0.0, 0, 1.0), (0.7, 1, 0.9), (0.0, 50, 0.5)]:
        tokens = kernels.top_k_top_p_sample(logits, *row_params([combo] * 24, "cuda"), torch.rand(24, device="cuda"))
        assert torch.equal(tokens.long(), logits.argmax(dim=-1)), f"seed={seed} {combo}"


@pytest.mark.gpu
def test_kernel_is_deterministic(compiled, seed):
    """Integer masses: the same inputs give the same tokens whatever order the atomics ran in."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(16, 151936, generator=gen) * 2).cuda()
    params = row_params([(1.0, 0, 0.95), (0.8, 1024, 0.9)] * 8, "cuda")
    uniform = torch.rand(16, generator=gen).cuda()
    first = kernels.top_k_top_p_sample(logits, *params, uniform)
    for _ in range(5):
        assert torch.equal(kernels.top_k_top_p_sample(logits, *params, uniform), first)


@pytest.mark.gpu
def test_kernel_replays_in_a_cuda_graph(compiled, seed):
    gen = torch.Generator().manual_seed(seed)
    batch, vocab = 8, 128256
    combos = GRID[::len(GRID) // batch][:batch]
    logits = torch.randn(batch, vocab, generator=gen).cuda()
    temperature, top_k, top_p = row_params(combos, "cuda")
    uniform = torch.rand(batch, generator=gen).cuda()
    kernels.top_k_top_p_sample(logits, temperature, top_k, top_p, uniform)  # warm-up outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens = kernels.top_k_top_p_sample(logits, temperature, top_k, top_p, uniform)
    for step in range(3):
        logits.copy_(torch.randn(batch, vocab, generator=gen) * (step + 1))
        uniform.copy_(torch.rand(batch, generator=gen))
        new = [GRID[i] for i in torch.randint(len(GRID), (batch,), generator=gen).tolist()]
        for param, values in zip((temperature, top_k, top_p), row_params(new)):
            param.copy_(values)
        graph.replay()
        assert_matches_reference(tokens, logits, temperature, top_k, top_p, uniform, f"seed={seed} step {step}")


@pytest.mark.gpu
def test_choose_uses_the_kernel_without_host_syncs(compiled, seed):
    """choose() on a GPU: the rows' uniform numbers, then the kernel; no host
    synchronisation on the way, even with per-row configs."""
    gen = torch.Generator().manual_seed(seed)
    combos = [GRID[i] for i in torch.randint(len(GRID), (12,), generator=gen).tolist()] + [(0.7, 5, 0.9)]
    logits = (torch.randn(len(combos), 49152, generator=gen) * 3).cuda()
    uniform = torch.rand(len(combos), generator=make_generator(seed, "cuda"), device="cuda")
    choose(logits, configs_of(combos), uniform)  # warm-up: pinned memory, module load
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tokens = choose(logits, configs_of(combos), uniform)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_matches_reference(tokens, logits, *row_params(combos, "cuda"), uniform, f"seed={seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1, 1000, 8193, 49152, 128256, 151937])
def test_argmax_rows_kernel_is_torch_argmax(compiled, seed, vocab, dtype):
    """Every row kind: ties at the maximum (the first wins), two values only, -inf rows, NaNs
    (the first NaN wins, as in torch.argmax), -0 tied with +0, and rows read with a stride."""
    gen = torch.Generator().manual_seed(seed)
    rows = 12
    logits = torch.randn(rows, vocab + 5, generator=gen)
    for b in range(6 if vocab >= 1024 else 0):  # make_hard's kinds need a vocabulary of top_k's sizes
        make_hard(logits[b, :vocab], b, gen)
    if vocab > 9:
        logits[6, [vocab - 1, 9]] = float("nan")
        logits[7, :vocab] = -1.0
        logits[7, [vocab - 1, 3]] = -0.0
        logits[7, 5] = 0.0  # -0 at 3 and +0 at 5 are equal: 3
        logits[8, vocab - 1] = float("inf")
    strided = logits.to(dtype).cuda()[:, :vocab]  # a row stride of vocab + 5
    want = strided.argmax(dim=-1)
    got = kernels.argmax_rows(strided)
    assert got.dtype == torch.int32 and torch.equal(got.long(), want), f"seed={seed}"
    assert torch.equal(argmax_rows(strided).long(), want)  # the runtime's greedy choice takes the kernel


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 9, 40])
def test_argmax_rows_kernel_writes_out_and_advances(compiled, seed, rows, dtype):
    """The kernel's out= (a view into a larger buffer) and advance= (each entry + 1 by the same
    launch, entries past the rows untouched), as a greedy decode graph uses them."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, 128256, generator=gen).to(dtype).cuda()
    out = torch.full((rows + 3,), -1, dtype=torch.int32, device="cuda")
    lengths = torch.randint(1, 1000, (rows + 3,), generator=gen, dtype=torch.int32).cuda()
    before = lengths.clone()
    got = kernels.argmax_rows(logits, out=out[:rows], advance=lengths[:rows])
    assert got.data_ptr() == out.data_ptr() and torch.equal(got.long(), logits.argmax(dim=-1))
    assert out[rows:].tolist() == [-1] * 3
    assert torch.equal(lengths[:rows], before[:rows] + 1) and torch.equal(lengths[rows:], before[rows:])
    kernels.argmax_rows(logits, out=out[:rows])  # out= alone leaves the lengths
    assert torch.equal(lengths[:rows], before[:rows] + 1)
