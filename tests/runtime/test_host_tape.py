"""Host tapes (runtime/host_tape.py): a CPU decode step recorded once and replayed. A replay
recomputes every PyTorch op and host kernel of the step into the tensors the recorded step
made; what cannot be replayed is refused at capture; a runner's tapes give the tokens of the
step run as usual, and a tape whose replay differs from the step is dropped (decode_graphs.py)."""
import pytest
import torch

from tensorrt_llm.ops.launch import bindings_available, get_bindings, launch, tensor_arg
from tensorrt_llm.runtime import ModelRunner
from tensorrt_llm.runtime.decode_graphs import VERIFY_STEPS
from tensorrt_llm.runtime.host_tape import HostTape, TapeRefused

from ..models.llama_utils import engine_from_hf, random_hf_llama


def plan_globals() -> dict:
    return {"__builtins__": {}}  # as a session's plan has: capture lends it __import__ only


def test_a_replay_recomputes_the_torch_ops_into_the_recorded_tensors():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 8, generator=g), torch.randn(4, 16, generator=g)
    rows = torch.tensor([2, 0])

    def step():
        y = torch.nn.functional.silu(a) * b[:, :8]  # a view of b, then two new tensors
        return torch.index_select(y, 0, rows) + 1

    globals_ = plan_globals()
    tape = HostTape()
    out = tape.capture(step, globals_)
    assert torch.equal(out, step()) and globals_ == plan_globals()
    for _ in range(2):
        a.copy_(torch.randn(4, 8, generator=g))
        b.copy_(torch.randn(4, 16, generator=g))
        rows.copy_(torch.randint(0, 4, (2,), generator=g))
        tape.replay()
        assert torch.equal(out, step())


@pytest.mark.skipif(not bindings_available(), reason="tensorrt_llm.bindings is not built")
def test_a_replay_repeats_the_host_kernel_calls():
    from tensorrt_llm.ops.norm import rms_norm_cpu
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(3, 64, generator=g), torch.randn(64, generator=g)
    tape = HostTape()
    out = tape.capture(lambda: rms_norm_cpu(x, w, eps=1e-6), plan_globals())
    [(prepared, _, _)] = tape.calls
    assert isinstance(prepared, get_bindings().HostCalls) and len(prepared) == 1
    x.copy_(torch.randn(3, 64, generator=g))
    tape.replay()
    assert torch.equal(out, rms_norm_cpu(x, w, eps=1e-6))


@pytest.mark.skipif(not bindings_available(), reason="tensorrt_llm.bindings is not built")
def test_host_calls_in_a_row_are_prepared_once_and_run_in_order():
    """Two host norms in a row become one prepared run, the PyTorch op between runs stays its
    own call, and the replay computes all three in the recorded order."""
    from tensorrt_llm.ops.norm import rms_norm_cpu
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(2, 32, generator=g), torch.randn(32, generator=g)

    def step():
        y = rms_norm_cpu(rms_norm_cpu(x, w, eps=1e-6), w, eps=1e-6)
        return rms_norm_cpu(y * 2, w, eps=1e-6)

    tape = HostTape()
    out = tape.capture(step, plan_globals())
    kinds = [len(fn) if isinstance(fn, get_bindings().HostCalls) else "torch" for fn, _, _ in tape.calls]
    assert kinds == [2, "torch", 1]
    x.copy_(torch.randn(2, 32, generator=g))
    tape.replay()
    assert torch.equal(out, step())


@pytest.mark.skipif(not bindings_available(), reason="tensorrt_llm.bindings is not built")
def test_prepared_host_calls_check_as_a_call_does():
    """prepare_host_calls binds and checks each call as the entry itself would (the same
    one-line errors, named by the entry), and takes host entries only."""
    bindings = get_bindings()
    x, w, out = torch.randn(2, 32), torch.randn(32), torch.empty(2, 32)
    args = (tensor_arg(out), tensor_arg(x), tensor_arg(w), 1e-6)
    prepared = bindings.prepare_host_calls([("host_rms_norm", args, {})])
    prepared()
    expected = torch.empty(2, 32)
    launch("host_rms_norm", expected, x, w, 1e-6)
    assert torch.equal(out, expected)
    with pytest.raises(ValueError, match="^host_rms_norm: .*weight"):
        bindings.prepare_host_calls([("host_rms_norm", (args[0], args[1], tensor_arg(torch.randn(31)), 1e-6), {})])
    with pytest.raises(TypeError, match="rms_norm is not a host entry"):
        bindings.prepare_host_calls([("rms_norm", args, {})])


def test_a_value_read_into_python_is_refused():
    x = torch.randn(4)
    with pytest.raises(TapeRefused, match="reads a value into Python"):
        HostTape().capture(lambda: x * float(x.sum()), plan_globals())


@torch.library.custom_op("trtllm_tests::doubled", mutates_args=())
def doubled(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def test_a_new_tensor_without_an_out_form_is_refused():
    x = torch.randn(4)
    with pytest.raises(TapeRefused, match="doubled.* has no out= form"):
        HostTape().capture(lambda: doubled(x) + 1, plan_globals())


@pytest.fixture(scope="module")
def engine_dir(tmp_path_factory):
    hf = random_hf_llama(seed=5)
    return engine_from_hf(hf, tmp_path_factory.mktemp("tape") / "engine", max_batch_size=4, max_input_len=16,
                          max_seq_len=48, tokens_per_block=8)


PROMPTS = [[5, 9, 2, 7, 1], [3, 3, 8], [11, 4, 6, 2, 9, 9, 1], [7]]


def generate(runner, prompts):
    out = runner.generate([torch.tensor(p, dtype=torch.int32) for p in prompts], max_new_tokens=20,
                          output_log_probs=True)
    return out["output_ids"], out["log_probs"]


@pytest.mark.skipif(not bindings_available(), reason="tensorrt_llm.bindings is not built")
def test_a_runner_with_tapes_gives_the_tokens_and_log_probs_of_one_without(engine_dir):
    plain = ModelRunner.from_dir(engine_dir, device="cpu", use_host_tape=False)
    taped = ModelRunner.from_dir(engine_dir, device="cpu")  # the CPU's default
    graphs = taped.executor.runner.decode_graphs
    assert plain.executor.runner.decode_graphs is None and graphs is not None
    for batch in ([PROMPTS[0]], PROMPTS[:3], PROMPTS, [PROMPTS[1]]):
        ids, log_probs = generate(plain, batch)
        taped_ids, taped_log_probs = generate(taped, batch)
        assert torch.equal(ids, taped_ids) and torch.equal(log_probs, taped_log_probs)
    # A tape per batch size that decoded (every size to 8 is a bucket on the CPU), each checked
    # against the step and then trusted.
    assert {1, 3, 4} <= set(graphs.graphs) <= {1, 2, 3, 4} and not graphs.plan_only
    assert all(left == 0 for left in graphs.unverified.values())


@pytest.mark.skipif(not bindings_available(), reason="tensorrt_llm.bindings is not built")
def test_a_tape_whose_replay_differs_from_the_step_is_dropped(engine_dir):
    plain = ModelRunner.from_dir(engine_dir, device="cpu", use_host_tape=False)
    taped = ModelRunner.from_dir(engine_dir, device="cpu")
    graphs = taped.executor.runner.decode_graphs
    capture = graphs._capture_tape

    def capture_without_the_last_call(b):
        capture(b)
        graphs.graphs[b].calls.pop()  # the LM head's: the replay's logits go stale

    graphs._capture_tape = capture_without_the_last_call
    assert VERIFY_STEPS >= 1
    ids, log_probs = generate(plain, [PROMPTS[2]])
    taped_ids, taped_log_probs = generate(taped, [PROMPTS[2]])
    assert torch.equal(ids, taped_ids) and torch.equal(log_probs, taped_log_probs)
    assert graphs.plan_only == {1} and 1 not in graphs.graphs


@pytest.mark.skipif(not bindings_available(), reason="tensorrt_llm.bindings is not built")
def test_decode_steps_copy_only_the_host_inputs_their_buffers_do_not_hold(engine_dir):
    """DecodeGraphs copies host lengths and block tables into its buffers only where they differ
    from what the buffers hold, and compares against a copy of its own: a caller's tensor changed
    in place after a step is copied again at the next."""
    graphs = ModelRunner.from_dir(engine_dir, device="cpu").executor.runner.decode_graphs
    tokens = torch.tensor([5, 9], dtype=torch.int32)
    lengths = torch.tensor([3, 6], dtype=torch.int32)
    tables = torch.zeros(2, graphs.block_tables.shape[1], dtype=torch.int32)
    tables[:, 0] = torch.tensor([1, 2])
    graphs.step(tokens, lengths, tables)
    graphs.block_tables[1, 3] = 7  # not what the step held: an equal table is not copied over it
    graphs.step(tokens, lengths.clone(), tables.clone())
    assert graphs.block_tables[1, 3] == 7
    lengths += 1  # in place, the same objects as the first step's
    tables[1, 1] = 3
    graphs.step(tokens, lengths, tables)
    assert graphs.sequence_lengths[:2].tolist() == [4, 7]
    assert torch.equal(graphs.block_tables[:2], tables)


def test_host_tapes_are_refused_off_the_cpu(engine_dir):
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="use_host_tape needs the CPU"):
            ModelRunner.from_dir(engine_dir, device="cuda", use_host_tape=True)
    with pytest.raises(ValueError, match="use_cuda_graph needs a CUDA device"):
        ModelRunner.from_dir(engine_dir, device="cpu", use_cuda_graph=True)


def test_a_step_that_does_not_repeat_itself_is_refused():
    count = torch.zeros(1)

    def step():
        count.add_(1)  # in place: a replay adds again
        return count * 2

    with pytest.raises(TapeRefused, match="another output on the same inputs"):
        HostTape().capture(step, plan_globals())


def test_an_out_form_that_refuses_the_recorded_arguments_refuses_the_tape():
    n = torch.ones(3)
    with pytest.raises(TapeRefused, match="its replay failed"):
        HostTape().capture(lambda: n + torch.arange(3, dtype=torch.float32), plan_globals())
