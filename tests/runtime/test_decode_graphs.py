"""DecodeGraphs on a GPU (random weights, so it runs where the bundled GGUF is not installed):
the greedy graphs, which take each row's argmax in the graph and leave it where the next step
reads its input, give the tokens of the steps run without graphs, for requests that join and
leave the batch at different steps beside requests that sample, penalise and ask for
log-probs (whose steps take the sampler)."""
import pytest
import torch

from tensorrt_llm.builder import BuildConfig, build
from tensorrt_llm.models.llama.convert import config_from_hf, load_weights_from_hf
from tensorrt_llm.models.llama.model import LLaMAForCausalLM
from tensorrt_llm.models.modeling_utils import save_checkpoint
from tensorrt_llm.runtime import ModelRunner
from tensorrt_llm.runtime.request import Request
from tensorrt_llm.runtime.sampling import SamplingConfig

from ..models.llama_utils import random_hf_llama
from .executor_utils import drive

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("decode_graphs")
    hf = random_hf_llama(seed=7, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                         num_key_value_heads=2)  # head size 64: the tensor-core attention
    config = config_from_hf(hf.config, dtype="bfloat16")
    save_checkpoint(tmp / "ckpt", config, [load_weights_from_hf(hf, config)])
    model = LLaMAForCausalLM.from_checkpoint(tmp / "ckpt")
    build(model, BuildConfig(max_batch_size=8, max_input_len=64, max_seq_len=128, tokens_per_block=16,
                             max_num_tokens=256)).save(tmp / "engine")
    return tmp / "engine"


def greedy(**kw):
    return SamplingConfig(top_k=1, **kw)


SPECS = {  # name: (step it arrives at, Request fields)
    "a": (0, dict(prompt_token_ids=list(range(3, 20)), max_new_tokens=24, sampling=greedy())),
    "b": (0, dict(prompt_token_ids=list(range(40, 45)), max_new_tokens=6, sampling=greedy())),
    "c": (2, dict(prompt_token_ids=list(range(60, 90)), max_new_tokens=20, sampling=greedy())),
    "sampled": (5, dict(prompt_token_ids=list(range(7, 15)), max_new_tokens=10,
                        sampling=SamplingConfig(temperature=0.9, top_k=20, random_seed=11))),
    "penalty": (9, dict(prompt_token_ids=list(range(100, 110)), max_new_tokens=10,
                        sampling=greedy(repetition_penalty=1.5))),
    "logprobs": (14, dict(prompt_token_ids=list(range(120, 126)), max_new_tokens=8, logprobs=True,
                          sampling=greedy())),
    "d": (20, dict(prompt_token_ids=list(range(200, 204)), max_new_tokens=30, sampling=greedy())),
    "logits": (3, dict(prompt_token_ids=list(range(210, 220)), max_new_tokens=12, sampling=greedy(),
                       return_generation_logits=True)),
}


def run(engine_dir, use_cuda_graph, names):
    runner = ModelRunner.from_dir(engine_dir, device="cuda", use_cuda_graph=use_cuda_graph)
    ex = runner.executor
    requests = {name: Request(**dict(SPECS[name][1])) for name in names}
    arrivals = {}
    for name in names:
        arrivals.setdefault(SPECS[name][0], []).append(requests[name])
    drive(ex, arrivals)
    graphs = ex.runner.decode_graphs
    return requests, graphs


@pytest.mark.parametrize("names", [["a"], ["a", "b", "c", "d", "logits"], list(SPECS)], ids=["one", "greedy", "mixed"])
def test_greedy_graphs_give_the_tokens_of_steps_without_graphs(engine_dir, names):
    with_graphs, graphs = run(engine_dir, True, names)
    without, _ = run(engine_dir, False, names)
    tokens = {n: r.output_token_ids for n, r in with_graphs.items()}
    assert tokens == {n: r.output_token_ids for n, r in without.items()}
    assert all(len(tokens[n]) == SPECS[n][1]["max_new_tokens"] for n in names)
    if "logits" in names:  # a greedy row's generation logits are those of its step, whichever graph ran it
        got, want = (torch.stack(r["logits"].generation_logits) for r in (with_graphs, without))
        torch.testing.assert_close(got, want)
    assert graphs.greedy_graphs, "the greedy steps replayed greedy graphs"
    if "sampled" in names:
        assert graphs.graphs, "the steps that sample replayed the plain graphs"


def test_graphs_captured_up_front_are_the_ones_the_steps_replay(engine_dir):
    """DecodeGraphs.capture() captures both graphs of each bucket (plain and greedy): a greedy
    generate afterwards captures nothing more."""
    runner = ModelRunner.from_dir(engine_dir, device="cuda")
    graphs = runner.executor.runner.decode_graphs
    graphs.capture([1, 2])
    assert sorted(graphs.graphs) == sorted(graphs.greedy_graphs) == [1, 2]
    captured = dict(graphs.graphs), dict(graphs.greedy_graphs)
    runner.generate([list(range(3, 20)), list(range(30, 40))], max_new_tokens=8)
    assert (graphs.graphs, graphs.greedy_graphs) == captured


def copies(fn, direction="HtoD") -> int:
    """How many copies of `direction` (HtoD: host to device, DtoH: back) the GPU ran during fn()."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if direction in e.name)


def host_to_device_copies(fn) -> int:
    return copies(fn, "HtoD")


def test_a_greedy_batch_that_keeps_its_blocks_copies_no_inputs(engine_dir):
    """A greedy replay advances the lengths on the device, so the next step of the same rows
    (lengths one higher, the same block tables, its input the last step's tokens) copies nothing
    from the host, and its tokens are the argmax of a plain step on the same inputs; a step
    whose tables differ copies those only."""
    runner = ModelRunner.from_dir(engine_dir, device="cuda")
    graphs = runner.executor.runner.decode_graphs
    graphs.capture([2])
    tables = torch.zeros(2, graphs.block_tables.shape[1], dtype=torch.int32)
    tables[:, :2] = torch.tensor([[1, 2], [3, 4]])
    lengths = torch.tensor([5, 12], dtype=torch.int32)
    inputs = [torch.tensor([7, 9], dtype=torch.int32)]
    first = inputs[0].cuda()
    assert host_to_device_copies(lambda: graphs.step_greedy(first, lengths, tables)) == 2
    inputs.append(graphs.input_ids[:2].cpu())
    assert graphs.sequence_lengths[:2].tolist() == (lengths + 1).tolist()
    for step in range(1, 4):  # as the executor steps a batch that goes on decoding greedily
        assert host_to_device_copies(
            lambda: graphs.step_greedy(graphs.input_ids[:2], lengths + step, tables)) == 0, f"step {step}"
        assert graphs.sequence_lengths[:2].tolist() == (lengths + step + 1).tolist()
        inputs.append(graphs.input_ids[:2].cpu())
    moved = tables.clone()
    moved[1, 2] = 5  # row 1 gains a block: the tables are copied, the lengths (as held) are not
    assert host_to_device_copies(lambda: graphs.step_greedy(graphs.input_ids[:2], lengths + 4, moved)) == 1
    assert graphs.block_tables[1, :3].tolist() == [3, 4, 5]
    # Each greedy step's tokens also reached its pinned host row (the rows used in turn).
    assert graphs._greedy_replays == 5 and int(graphs.token_slot) == 5
    torch.testing.assert_close(graphs.host_tokens[0, :2], graphs.input_ids[:2].cpu())  # the fifth step's
    assert graphs.host_tokens[1, :2].tolist() == inputs[4].tolist()  # the fourth's
    # The same steps again as plain steps, every input copied: the same tokens.
    for step in range(4):
        logits = graphs.step(inputs[step].cuda(), lengths + step, tables)
        assert torch.equal(logits.argmax(dim=-1).int().cpu(), inputs[step + 1]), f"step {step}"


def test_greedy_decode_steps_queue_no_copy_of_their_tokens(engine_dir):
    """The greedy graph writes each step's tokens into pinned host memory itself, so an
    executor's greedy decode steps queue no device-to-host copy; the tokens are those of the
    same request run without graphs. Steps that sample still copy theirs."""
    def steps(use_cuda_graph, request):
        ex = ModelRunner.from_dir(engine_dir, device="cuda", use_cuda_graph=use_cuda_graph).executor
        r = Request(**request)
        ex.add_request(r)
        for _ in range(3):  # the prompt's step, then decode steps (the first captures the graphs)
            ex.step()

        def rest():
            while ex.has_work:
                ex.step()
        return r, copies(rest, "DtoH")
    r, queued = steps(True, dict(SPECS["a"][1]))
    assert queued == 0
    alone, _ = steps(False, dict(SPECS["a"][1]))
    assert r.output_token_ids == alone.output_token_ids and len(r.output_token_ids) == 24
    _, queued = steps(True, dict(SPECS["sampled"][1]))
    assert queued > 0


def test_argmax_rows_writes_pinned_host_rows_in_turn():
    """argmax_rows(host_out=, host_slot=): the tokens in host_out[slot % 2], slot + 1; a pageable
    or device host_out is refused."""
    from tensorrt_llm.kernels import cuda_kernels_available
    from tensorrt_llm.runtime.sampling import argmax_rows
    if not cuda_kernels_available():
        pytest.skip("needs the compiled CUDA kernels")
    logits = torch.randn(37, 1000, device="cuda")
    host = torch.full((2, 40), -1, dtype=torch.int32, pin_memory=True)
    slot = torch.zeros(1, dtype=torch.int32, device="cuda")
    for turn in range(3):
        tokens = argmax_rows(logits * (turn + 1) - turn, host_out=host, host_slot=slot)
        torch.cuda.synchronize()
        assert host[turn % 2, :37].tolist() == tokens.tolist() == logits.argmax(-1).tolist()
        assert int(slot) == turn + 1
    assert host[:, 37:].eq(-1).all()
    with pytest.raises(ValueError, match="host_out must be pinned host memory"):
        argmax_rows(logits, host_out=torch.zeros(2, 40, dtype=torch.int32), host_slot=slot)
    with pytest.raises(ValueError, match="host_out must be pinned host memory"):
        argmax_rows(logits, host_out=torch.zeros(2, 40, dtype=torch.int32, device="cuda"), host_slot=slot)


def test_the_binding_refuses_a_host_out_that_is_not_pinned_host_memory():
    """The binding checks host_out with the driver (a kernel writing pageable memory would fault)."""
    from tensorrt_llm.kernels import cuda_kernels_available
    from tensorrt_llm.ops.launch import get_bindings, launch
    if not cuda_kernels_available():
        pytest.skip("needs the compiled CUDA kernels")
    logits = torch.randn(2, 5000, device="cuda")
    out = torch.empty(2, dtype=torch.int32, device="cuda")
    workspace = torch.empty(2 * -(-5000 // get_bindings().ARGMAX_CHUNK), dtype=torch.int64, device="cuda")
    slot = torch.zeros(1, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="host_out is not page-locked host memory"):
        launch("argmax_rows", out, logits, workspace, host_out=torch.zeros(2, 2, dtype=torch.int32), host_slot=slot)
    with pytest.raises(ValueError, match="host_out .* must be a pinned host"):
        launch("argmax_rows", out, logits, workspace, host_out=torch.zeros(2, 2, dtype=torch.int32, device="cuda"),
               host_slot=slot)
    with pytest.raises(ValueError, match=r"host_out .* must be \[2, W\] with W >= the 2 rows"):
        launch("argmax_rows", out, logits, workspace, host_out=torch.zeros(2, 1, dtype=torch.int32).pin_memory(),
               host_slot=slot)
    with pytest.raises(ValueError, match="host_out and host_slot must be given together"):
        launch("argmax_rows", out, logits, workspace, host_out=torch.zeros(2, 2, dtype=torch.int32).pin_memory())
