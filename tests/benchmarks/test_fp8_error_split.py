"""benchmarks/fp8_error_split.py: its block and group roundings against a plain per-block loop on
random data, and the script on a tiny random LLaMA (a Hugging Face folder with a word tokenizer)
as a user runs it: float is the baseline, every scheme moves the perplexity, bad schemes are one
line."""
import json

import pytest
import torch

from tensorrt_llm.quantization.formats import FP8_DTYPE, FP8_MAX

from ..commands.test_cli_errors import save_tokenizer_of_words
from ..commands.test_cli_workflow import load_script
from ..models.llama_utils import random_hf_llama


def split():
    return load_script("benchmarks/fp8_error_split.py")


def e4m3(values: torch.Tensor) -> torch.Tensor:
    """Each slice's values rounded to E4M3 at its own amax / 448, scaled back: the plain form."""
    scale = values.abs().max() / FP8_MAX
    return (values / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float() * scale


def test_block_weights_round_each_block_at_its_own_scale():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(12, 8, generator=gen) * torch.logspace(-3, 2, 12)[:, None]  # blocks far apart in size
    got = split().round_weight(w, "b4")
    for r in range(0, 12, 4):
        for c in range(0, 8, 4):
            assert torch.equal(got[r:r + 4, c:c + 4], e4m3(w[r:r + 4, c:c + 4]))


def test_grouped_activations_round_each_group_at_its_own_scale():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 12, generator=gen) * torch.logspace(-2, 3, 12)
    got = split().round_activation(x, "g4")
    for i in range(2):
        for t in range(3):
            for c in range(0, 12, 4):
                want = e4m3(x[i, t, c:c + 4])
                assert torch.allclose(got[i, t, c:c + 4], want, rtol=2 ** -20, atol=0)


def test_token_and_channel_scales_are_the_engines_rounding():
    gen = torch.Generator().manual_seed(2)
    module = split()
    w, x = torch.randn(6, 8, generator=gen), torch.randn(5, 8, generator=gen)
    for r in range(6):
        assert torch.equal(module.round_weight(w, "pc")[r], e4m3(w[r]))
    assert torch.equal(module.round_weight(w, "pt"), e4m3(w))
    for t in range(5):
        assert torch.allclose(module.round_activation(x, "tok")[t], e4m3(x[t]), rtol=2 ** -20, atol=0)
    assert module.round_weight(w, "none") is w and module.round_activation(x, "none") is x


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("split") / "hf"
    random_hf_llama(seed=3, num_key_value_heads=2).save_pretrained(folder)
    save_tokenizer_of_words(folder)
    return folder


def test_script_reports_each_scheme_against_float(hf_dir, tmp_path, capsys):
    out = tmp_path / "split.json"
    schemes = "pc:none,none:tok,pt:tok,b16:g32"
    assert split().main(["--model_dir", str(hf_dir), "--schemes", schemes, "--articles", "4", "--threads", "1",
                         "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["schemes"]) == ["none:none", *schemes.split(",")] and result["articles"] == 4
    assert result["schemes"]["none:none"]["change_percent"] == 0
    base = result["schemes"]["none:none"]["perplexity"]
    for name in schemes.split(","):
        ppl = result["schemes"][name]["perplexity"]
        assert ppl != base and abs(result["schemes"][name]["change_percent"] - 100 * (ppl / base - 1)) < 1e-9
    printed = capsys.readouterr().out
    assert "4 articles" in printed and "b16:g32" in printed


@pytest.mark.parametrize("schemes, message", [
    ("pc:x", "a scheme is WEIGHTS:ACTIVATIONS"),
    ("pc", "a scheme is WEIGHTS:ACTIVATIONS"),
    ("b0:tok", "a scheme is WEIGHTS:ACTIVATIONS"),
    ("pc:g7", "activation groups of 7 do not tile"),
    ("b48:tok", "weight blocks of 48 do not tile"),
])
def test_bad_schemes_are_one_line(hf_dir, schemes, message, capsys):
    with pytest.raises(SystemExit) as e:
        split().main(["--model_dir", str(hf_dir), "--schemes", schemes, "--articles", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "\n".join(err)


def test_missing_model_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        split().main(["--model_dir", str(tmp_path / "absent"), "--schemes", "pc:tok"])
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err
