"""StepRunner's packed input tokens: known tokens from the host, pending ones (sampled by the
previous step, still on the device) gathered where they are."""
import pytest
import torch

from tensorrt_llm.runtime.step_runner import StepInput, StepRunner


def _runner() -> StepRunner:
    runner = StepRunner.__new__(StepRunner)  # _input_ids needs no session, cache or device
    runner.device, runner._pin = torch.device("cpu"), False
    return runner


def test_a_batch_decoding_its_last_tokens_in_order_takes_them_as_they_are():
    sampled = torch.tensor([11, 12, 13], dtype=torch.int32)
    rows = [StepInput(i, [], 7, 1, pending=(sampled, i)) for i in range(3)]
    assert _runner()._input_ids(rows) is sampled


@pytest.mark.parametrize("case", ["reordered", "fewer_rows", "with_a_prompt"])
def test_other_mixes_gather_the_pending_tokens(case):
    sampled = torch.tensor([11, 12, 13], dtype=torch.int32)
    if case == "reordered":
        rows = [StepInput(i, [], 7, 1, pending=(sampled, j)) for i, j in enumerate((2, 0, 1))]
        want = [13, 11, 12]
    elif case == "fewer_rows":  # the first request left the batch
        rows = [StepInput(i, [], 7, 1, pending=(sampled, j)) for i, j in enumerate((1, 2))]
        want = [12, 13]
    else:  # a new prompt beside two decodes
        rows = [StepInput(0, [], 7, 1, pending=(sampled, 0)), StepInput(5, [4, 5, 6], 0, 3),
                StepInput(1, [], 9, 1, pending=(sampled, 1))]
        want = [11, 4, 5, 6, 12]
    got = _runner()._input_ids(rows)
    assert got is not sampled and got.dtype == torch.int32 and got.tolist() == want


def test_pending_tokens_of_two_steps_are_refused():
    a, b = torch.tensor([1], dtype=torch.int32), torch.tensor([2], dtype=torch.int32)
    with pytest.raises(ValueError, match="previous step"):
        _runner()._input_ids([StepInput(0, [], 3, 1, pending=(a, 0)), StepInput(1, [], 3, 1, pending=(b, 0))])
