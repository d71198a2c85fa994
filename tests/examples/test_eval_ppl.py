"""examples/eval_ppl.py: the perplexity of engines over the project's articles (teacher
forcing), which is transformers' on the same tokens for a float engine; engines compared with
the first; one-line errors."""
import json
import math
from pathlib import Path

import pytest
import torch

from ..commands.test_cli_errors import save_tokenizer_of_words
from ..commands.test_cli_workflow import load_script
from ..models.llama_utils import engine_from_hf, random_hf_llama


def eval_ppl():
    return load_script("examples/eval_ppl.py")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ppl")
    hf = random_hf_llama(seed=3)
    save_tokenizer_of_words(tmp / "tok")
    return hf, engine_from_hf(hf, tmp / "engine", max_batch_size=1, max_input_len=128, max_seq_len=160), tmp


def _articles(tmp: Path) -> Path:
    """Three "articles" of the word tokenizer's words (ids 5..)."""
    path = tmp / "articles.jsonl"
    rows = [" ".join(f"w{5 + (7 * i + 3 * j) % 300}" for j in range(25 + 5 * i)) for i in range(3)]
    path.write_text("".join(json.dumps({"article": a}) + "\n" for a in rows))
    return path


def test_perplexity_is_transformers_on_the_same_tokens(model, capsys):
    hf, engine, tmp = model
    module = eval_ppl()
    data = _articles(tmp)
    assert module.main(["--engine_dir", str(engine), "--engine_dir", str(engine), "--tokenizer_dir", str(tmp / "tok"),
                        "--data_file", str(data), "--max_tokens", "24", "--json", str(tmp / "ppl.json")]) == 0
    out = capsys.readouterr().out
    assert "3 articles" in out and f"(+0.00% vs {engine})" in out
    result = json.loads((tmp / "ppl.json").read_text())
    from tensorrt_llm.tokenizer_utils import load_tokenizer
    prompts = module.article_token_ids(load_tokenizer(tmp / "tok"), None, 24, data)
    assert result["tokens"] == sum(len(p) - 1 for p in prompts) == 23 * 3
    total = 0.0
    with torch.no_grad():
        for p in prompts:
            logits = hf(torch.tensor([p])).logits[0]
            total += float(torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(p[1:]), reduction="sum"))
    want = math.exp(total / result["tokens"])
    assert [e["engine_dir"] for e in result["engines"]] == [str(engine)] * 2
    assert result["engines"][0]["perplexity"] == result["engines"][1]["perplexity"] == pytest.approx(want, rel=1e-4)


def test_bad_data_is_one_line(model, tmp_path):
    from tensorrt_llm.errors import ConfigError
    _, engine, tmp = model
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"article": "w5 w6"}\nnot json\n')
    with pytest.raises(ConfigError, match="line 2 is not valid JSON"):
        eval_ppl().main(["--engine_dir", str(engine), "--tokenizer_dir", str(tmp / "tok"), "--data_file", str(bad)])
    with pytest.raises(ConfigError, match="has none; pass --tokenizer_dir"):
        eval_ppl().main(["--engine_dir", str(engine)])
    with pytest.raises(SystemExit):
        eval_ppl().main(["--engine_dir", str(engine), "--max_tokens", "1"])
