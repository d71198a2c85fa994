"""Whatever model a user names -> an engine folder, built once and cached.

    resolved = resolve_engine("SmolLM2-135M-Instruct.Q4_1.gguf", max_seq_len=512)
    runner = ModelRunner.from_dir(resolved.engine_dir)
    tokenizer = load_tokenizer(resolved.tokenizer_source)

`model` is a local path to one of four kinds (detect_kind):

- ``engine``: an engine folder (``config.json`` of the engine format + ``rank0.engine``, what
  ``Engine.from_dir`` reads): used as it is, never copied or rebuilt;
- ``checkpoint``: a checkpoint folder (``config.json`` naming an ``architecture`` +
  ``rank0.safetensors``): built as ``trtllm-build`` builds it (commands/build.py);
- ``hf``: a Hugging Face model folder (``config.json`` with a ``model_type`` this package
  converts: llama, gpt2, opt, phi, bloom): converted by ``tensorrt_llm.models.<family>.convert``
  (what examples/convert_checkpoint.py calls), then built;
- ``gguf``: a llama.cpp GGUF file (it starts with ``GGUF``): converted by
  ``tensorrt_llm.models.llama.convert`` (what examples/llama/convert_checkpoint.py calls), then built.

Nothing is downloaded: a name that is not a local path (``meta-llama/Llama-3.2-1B``) is
refused. Nothing from the model runs: the converters read data only (safetensors,
``torch.load(weights_only=True)``, GGUF), transformers is never asked to trust remote code, and
the engine is checked at load (docs/security.md).

The cache
---------
Built engines live in ``cache_dir`` (default ``$TRTLLM_CACHE_DIR``, else
``~/.cache/tensorrt_llm/engines``)::

    <cache_dir>/
      <name>-<key[:24]>/        one engine folder per key: config.json, rank0.engine, the
                                tokenizer files (so the folder is self-contained) and
                                build_info.json (what it was built from, for people: never read)
      .locks/<entry>.lock       flock'ed while a process builds that entry
      .<entry>.tmp-*/           a build in progress (atomic_output_dir), renamed to <entry> when whole
      .<entry>.convert-*/       a temporary checkpoint while converting (deleted after the build)

``<name>`` is the source's file or folder name (letters, digits, ``._-`` only); ``key`` is the
sha256 of: the package version and cache format, the kind, the source's identity (for a file
its absolute path, size and mtime_ns; for a folder the same for each of its files, recursively,
sorted, skipping names that start with ``.``), the build options as given (None stays None:
the defaults, build_config_for, follow from the source and the machine), the dtype as given, and the target device (this
machine's GPU, or ``any`` without one). So touching, replacing or editing the source, changing
an option, or moving between a CPU and a GPU machine builds a new entry; old entries are never
deleted here (remove the folders to reclaim the space).

An entry appears only whole: the engine is built into a temporary folder beside it and renamed
in (``atomic_output_dir``), so a crash or an interrupt mid-build leaves no entry a later call
would take. A process killed outright leaves its hidden temporary folders; the next build of
that entry deletes them (under the entry's lock, so never those of a live builder). Two
processes asking for one missing entry build it once: the second waits on the first's lock,
then finds the entry. Where the file system has no locks both build, and the one that finishes
second discards its own engine and uses the first's. An entry whose engine no longer reads
(edited, half-deleted, of another format) is rebuilt.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

try:
    import fcntl
except ImportError:  # not POSIX: no build lock, the atomic rename still keeps entries whole
    fcntl = None

from .._utils import read_json_object
from ..builder import BuildConfig, current_device_target, read_engine_config
from ..errors import CheckpointError, ConfigError, EngineError
from ..mapping import Mapping
from ..models.modeling_utils import (
    CONFIG_NAME,
    MODEL_DTYPES,
    PretrainedConfig,
    atomic_output_dir,
    rank_weights_name,
    with_pp_partition,
    write_checkpoint,
)
from ..quantization.awq_gptq import awq_gptq_method
from ..tokenizer_utils import TOKENIZER_FILES, save_tokenizer
from ..version import __version__

CACHE_DIR_ENV = "TRTLLM_CACHE_DIR"
DEFAULT_CACHE_DIR = "~/.cache/tensorrt_llm/engines"
# Bumped when what a cache entry holds, or how its key is made, changes.
CACHE_FORMAT = 1
BUILD_INFO = "build_info.json"

KINDS = ("engine", "checkpoint", "hf", "gguf")
# Hugging Face model_type -> the package under tensorrt_llm.models whose convert module reads it
# (the same families examples/convert_checkpoint.py offers).
HF_CONVERTERS = {"llama": "llama", "gpt2": "gpt", "opt": "opt", "phi": "phi", "bloom": "bloom"}
GGUF_MAGIC = b"GGUF"

# Build defaults, per machine: on a GPU the runtime sizes the KV cache by free memory, on the
# CPU it allocates what the limits imply (ModelRunner), so the CPU's are smaller.
GPU_DEFAULTS = {"max_batch_size": 64, "max_seq_len_cap": 4096, "max_num_tokens": 8192}
CPU_DEFAULTS = {"max_batch_size": 8, "max_seq_len_cap": 2048, "max_num_tokens": 8192}

BUILD_OPTIONS = ("max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "max_beam_width",
                 "tokens_per_block")

_EXPECTED = ("an engine folder (config.json + rank0.engine), a checkpoint folder (config.json "
             "naming an architecture + rank0.safetensors), a Hugging Face model folder (config.json "
             "with a model_type) or a .gguf file")


@dataclass(frozen=True)
class ResolvedModel:
    """An engine folder ready for ModelRunner.from_dir.

    engine_dir: the engine (the user's own folder for kind "engine", else a cache entry).
    tokenizer_source: what tokenizer_utils.load_tokenizer reads the model's tokenizer from (the
        engine folder when it holds tokenizer files), None when the model came without one.
    kind: what `model` was: "engine", "checkpoint", "hf" or "gguf".
    built: True when this call built the engine, False when it existed (a cache hit, or an
        engine folder)."""
    engine_dir: Path
    tokenizer_source: Optional[Path]
    kind: str
    built: bool


# trtllm-build's own steps (tensorrt_llm/commands/build.py), imported when first called: `import
# tensorrt_llm` imports this module, and `python -m tensorrt_llm.commands.build` warns when that
# module is already imported before it runs as __main__.

def checkpoint_config(checkpoint_dir) -> PretrainedConfig:
    from ..commands import build
    return build.checkpoint_config(checkpoint_dir)


def check_build(config: PretrainedConfig, build_config: BuildConfig, dtype: Optional[str] = None) -> BuildConfig:
    from ..commands import build
    return build.check_build(config, build_config, dtype)


def build_engines(checkpoint_dir, output_dir, config: PretrainedConfig, build_config: BuildConfig,
                  **kwargs) -> int:
    from ..commands import build
    return build.build_engines(checkpoint_dir, output_dir, config, build_config, **kwargs)


def default_cache_dir() -> Path:
    """$TRTLLM_CACHE_DIR, else ~/.cache/tensorrt_llm/engines."""
    return Path(os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR).expanduser()


def _on_gpu() -> bool:
    import torch
    return torch.cuda.is_available()


def local_path(model) -> Path:
    """`model` (a str or os.PathLike) as an absolute path that exists; ConfigError otherwise
    (a model name is never looked up on a hub)."""
    if not isinstance(model, (str, os.PathLike)) or not os.fspath(model):
        raise ConfigError(f"model must be a path to {_EXPECTED}; got {model!r}")
    path = Path(model).expanduser()
    try:
        exists = path.exists()
    except (OSError, ValueError):  # a name too long, or holding a NUL byte
        exists = False
    if not exists:
        name = os.fspath(model)
        hub = ("; models are never downloaded: fetch it yourself (e.g. `huggingface-cli download "
               f"{name} --local-dir DIR`) and pass the folder"
               if re.fullmatch(r"[\w.-]+/[\w.-]+", name) else "")
        raise ConfigError(f"model {name!r} does not exist: expected a local path to {_EXPECTED}{hub}")
    return path.resolve()


def detect_kind(path) -> str:
    """"engine", "checkpoint", "hf" or "gguf" for an existing path; ConfigError (naming the
    path and what was expected) for anything else. Reads only config.json and 4 bytes."""
    path = Path(path)
    if path.is_file():
        try:
            with open(path, "rb") as f:
                magic = f.read(len(GGUF_MAGIC))
        except OSError as e:
            raise ConfigError(f"{path} cannot be read ({e.strerror or e}): expected {_EXPECTED}") from None
        if magic == GGUF_MAGIC:
            return "gguf"
        raise ConfigError(f"{path} is a file but not a GGUF file (it does not start with 'GGUF'): "
                          f"expected {_EXPECTED}")
    if not path.is_dir():
        raise ConfigError(f"{path} is neither a file nor a folder: expected {_EXPECTED}")
    config_path = path / CONFIG_NAME
    if not config_path.is_file():
        raise ConfigError(f"{path} has no {CONFIG_NAME}: expected {_EXPECTED}")
    if (path / "rank0.engine").is_file():
        return "engine"
    config = read_json_object(config_path, ConfigError, f": expected {_EXPECTED}")
    if isinstance(config.get("architecture"), str):
        if not (path / rank_weights_name(0)).is_file():
            raise ConfigError(f"{path} looks like a checkpoint folder (its {CONFIG_NAME} names an "
                              f"architecture) but has no {rank_weights_name(0)}")
        return "checkpoint"
    if "model_type" in config:
        model_type = config["model_type"]
        if model_type not in HF_CONVERTERS:
            raise ConfigError(f"{path} is a Hugging Face model of model_type {str(model_type)[:60]!r}, "
                              f"which this package does not convert (supported: "
                              f"{', '.join(HF_CONVERTERS)})")
        return "hf"
    raise ConfigError(f"{config_path} names neither an architecture nor a model_type: expected {_EXPECTED}")


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def _check_options(dtype, options: dict) -> None:
    """ConfigError for a dtype or build option out of range, before any work."""
    if dtype != "auto" and dtype not in MODEL_DTYPES:
        raise ConfigError(f"dtype must be 'auto' or one of {', '.join(MODEL_DTYPES)}, got {dtype!r}")
    BuildConfig(**{k: v for k, v in options.items() if v is not None})


def source_identity(path: Path) -> list:
    """[[absolute path, size, mtime_ns], ...] of the file, or of every file under the folder
    (recursively, sorted; names starting with '.' skipped: converters never read them)."""
    path = Path(path)
    if path.is_file():
        files = [path]
    else:
        files = []
        for root, dirs, names in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            files.extend(Path(root) / n for n in names if not n.startswith("."))
    identity = []
    for f in sorted(files):
        try:
            st = f.stat()
        except OSError:  # a dangling link: its own identity
            st = f.lstat()
        identity.append([str(f), st.st_size, st.st_mtime_ns])
    return identity


def cache_key(path: Path, kind: str, options: dict, dtype: str, target_device: str,
              mapping: Optional[Mapping] = None) -> str:
    """sha256 (hex) of everything an entry's engine follows from (see the module docstring);
    a multi-rank mapping too (a one-rank engine keeps the key it always had)."""
    material = {
        "cache_format": CACHE_FORMAT,
        "package_version": __version__,
        "kind": kind,
        "source": source_identity(path),
        "build_options": {k: options.get(k) for k in BUILD_OPTIONS},
        "defaults": GPU_DEFAULTS if target_device.startswith("cuda") else CPU_DEFAULTS,
        "optimizations": BuildConfig().optimizations,
        "dtype": dtype,
        "target_device": target_device,
    }
    if mapping is not None and mapping.world_size > 1:
        material["mapping"] = {"tp_size": mapping.tp_size, "pp_size": mapping.pp_size}
        if mapping.pp_size > 1 and kind != "checkpoint":
            # A conversion's stages are split by weight (with_pp_partition): not an entry of
            # the even split made before. (A checkpoint folder's split is its own, in its files.)
            material["mapping"]["pp_partition"] = mapping.pp_partition or "balanced"
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _entry_name(path: Path, key: str) -> str:
    name = path.stem if path.is_file() else path.name
    name = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:64].lstrip(".") or "model"
    return f"{name}-{key[:24]}"


def build_config_for(options: dict, max_position_embeddings: int, on_gpu: bool,
                     target_device: str) -> BuildConfig:
    """The BuildConfig of the given options (None: a default below) for a model of
    `max_position_embeddings`:

    - max_batch_size: 64 on a GPU, 8 on the CPU;
    - max_seq_len: the model's max_position_embeddings, capped at 4096 on a GPU and 2048 on
      the CPU (but never below a given max_input_len);
    - max_input_len: max_seq_len (a prompt may fill the window);
    - max_num_tokens: max_batch_size * max_input_len capped at 8192, but at least max_input_len;
    - max_beam_width 1 and tokens_per_block 32 (BuildConfig's).
    """
    d = GPU_DEFAULTS if on_gpu else CPU_DEFAULTS
    batch = options.get("max_batch_size") or d["max_batch_size"]
    max_input_len = options.get("max_input_len")
    max_seq_len = options.get("max_seq_len")
    if max_seq_len is None:
        max_seq_len = min(max_position_embeddings, max(d["max_seq_len_cap"], max_input_len or 0))
    if max_input_len is None:
        max_input_len = max_seq_len
    max_num_tokens = options.get("max_num_tokens")
    if max_num_tokens is None:
        max_num_tokens = max(min(d["max_num_tokens"], batch * max_input_len), max_input_len)
    kwargs = {"max_batch_size": batch, "max_input_len": max_input_len, "max_seq_len": max_seq_len,
              "max_num_tokens": max_num_tokens, "target_device": target_device}
    for name in ("max_beam_width", "tokens_per_block"):
        if options.get(name) is not None:
            kwargs[name] = options[name]
    return BuildConfig(**kwargs)


def _auto_dtype(kind: str, source_dtype: str, on_gpu: bool) -> str:
    """dtype "auto": float32 on the CPU; on a GPU the converter's float32 for GGUF (its
    dequantised weights are exact only in float32), else the source's float16/bfloat16, else
    bfloat16."""
    if not on_gpu:
        return "float32"
    if kind == "gguf":
        return source_dtype
    return source_dtype if source_dtype in ("float16", "bfloat16") else "bfloat16"


def _source(path: Path, kind: str, dtype: str, on_gpu: bool, mapping: Optional[Mapping] = None):
    """(config, rank -> weights) of a Hugging Face folder or GGUF file, through the
    converters examples/convert_checkpoint.py and examples/llama/convert_checkpoint.py call,
    split for `mapping` (default one rank). Only the config is read here; the weights are
    converted when the function is called."""
    mapping = mapping or Mapping()
    if kind == "gguf":
        from ..models.llama import convert
        reader = convert.open_gguf(path)
        config = convert.config_from_gguf(path, "float32" if dtype == "auto" else dtype, mapping, reader=reader)
        if dtype == "auto":
            config = _with_dtype(config, _auto_dtype(kind, config.dtype, on_gpu))
        config = with_pp_partition(config)
        return config, lambda r: convert.load_weights_from_gguf(path, config, config.mapping.with_rank(r),
                                                                reader=reader)
    model_type = read_json_object(path / CONFIG_NAME, ConfigError).get("model_type")
    if model_type not in HF_CONVERTERS:  # it was, when detect_kind read the file
        raise ConfigError(f"{path / CONFIG_NAME} changed while being read; try again")
    convert = importlib.import_module(f"tensorrt_llm.models.{HF_CONVERTERS[model_type]}.convert")
    config = convert.config_from_hf(path, None, mapping)  # the source's dtype
    config = _with_dtype(config, _auto_dtype(kind, config.dtype, on_gpu) if dtype == "auto" else dtype)
    config = with_pp_partition(config)  # the balanced stages (pipeline_parallel_size > 1)
    method = awq_gptq_method(path)
    if method is not None:  # its 4-bit linears stay INT4 (examples/llama/convert_checkpoint.py)
        if not hasattr(convert, "load_weight_only_from_awq_gptq"):
            raise ConfigError(f"{path}: {method.upper()} checkpoints of model_type {model_type!r} are not supported "
                              "(LLaMA-family ones are)")
        config, weights = convert.load_weight_only_from_awq_gptq(path, config)
        return config, lambda r: weights
    return config, lambda r: convert.load_weights_from_hf(path, config, config.mapping.with_rank(r))


def _with_dtype(config: PretrainedConfig, dtype: str) -> PretrainedConfig:
    return config if config.dtype == dtype else dataclasses.replace(config, dtype=dtype)


def _engine_ready(entry: Path) -> bool:
    """True when the folder holds a whole engine of this package (config.json that reads and
    every rank file)."""
    try:
        config = read_engine_config(entry)
    except (EngineError, OSError):
        return False
    world = config["pretrained_config"]["mapping"]["world_size"]
    return all((entry / f"rank{r}.engine").is_file() for r in range(world))


def _resolved(entry: Path, kind: str, built: bool) -> ResolvedModel:
    return ResolvedModel(entry, entry if _has_tokenizer(entry) else None, kind, built)


def _asked_mapping(tensor_parallel_size: Optional[int], pipeline_parallel_size: Optional[int]) -> Optional[Mapping]:
    """The split asked for (an unset size is 1), or None when neither size is given."""
    if tensor_parallel_size is None and pipeline_parallel_size is None:
        return None
    sizes = {"tensor_parallel_size": 1 if tensor_parallel_size is None else tensor_parallel_size,
             "pipeline_parallel_size": 1 if pipeline_parallel_size is None else pipeline_parallel_size}
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    tp, pp = sizes.values()
    return Mapping(world_size=tp * pp, tp_size=tp, pp_size=pp)


def folder_split(model, tensor_parallel_size: Optional[int] = None,
                 pipeline_parallel_size: Optional[int] = None) -> Mapping:
    """The split `resolve_engine` will give `model`: the one asked for, else an engine or
    checkpoint folder's own (so a TP2 engine needs no tensor_parallel_size=2), else one rank.
    Checks only what it reads; resolve_engine says what is wrong with a bad path."""
    asked = _asked_mapping(tensor_parallel_size, pipeline_parallel_size)
    if asked is not None:
        return asked
    try:
        path = local_path(model)
        kind = detect_kind(path)
        if kind == "engine":
            built = Mapping.from_dict(read_engine_config(path)["pretrained_config"]["mapping"])
        elif kind == "checkpoint":
            built = checkpoint_config(path).mapping
        else:
            return Mapping()
    except (ConfigError, EngineError, CheckpointError, OSError):
        return Mapping()
    return Mapping(world_size=built.world_size, tp_size=built.tp_size, pp_size=built.pp_size,
                   pp_partition=built.pp_partition)


def _check_mapping(what: str, built: Mapping, mapping: Optional[Mapping]) -> None:
    """An engine or checkpoint folder keeps the split it was made with."""
    if mapping is not None and (built.tp_size, built.pp_size) != (mapping.tp_size, mapping.pp_size):
        raise ConfigError(f"{what} has tp_size {built.tp_size} and pp_size {built.pp_size} "
                          f"({built.world_size} rank(s)); tensor_parallel_size {mapping.tp_size} and "
                          f"pipeline_parallel_size {mapping.pp_size} were asked for")


def _check_engine_options(path: Path, options: dict, dtype: str, mapping: Optional[Mapping] = None) -> None:
    """An engine folder is used as built: options that contradict it are a ConfigError."""
    config = read_engine_config(path)
    _check_mapping(f"engine folder {path}", Mapping.from_dict(config["pretrained_config"]["mapping"]), mapping)
    built = config["build_config"]
    differ = [f"{k} {v} (it has {built.get(k)})" for k, v in options.items()
              if v is not None and built.get(k) != v]
    if dtype != "auto" and config["pretrained_config"].get("dtype") != dtype:
        differ.append(f"dtype {dtype} (it has {config['pretrained_config'].get('dtype')})")
    if differ:
        raise ConfigError(f"{path} is an engine folder, used as it was built; it cannot take "
                          f"{', '.join(differ)}: pass its checkpoint or model instead, or drop "
                          f"those options")


@contextlib.contextmanager
def _build_lock(cache: Path, name: str, say: Callable[[str], None]) -> Iterator[bool]:
    """Holds an exclusive flock on .locks/<name>.lock (released when the process dies, so it
    never goes stale); yields whether it is held. Without working locks it yields False (see
    _LostRace)."""
    if fcntl is None:
        yield False
        return
    locks = cache / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / f"{name}.lock", "a+") as f:
        try:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                say(f"[tensorrt_llm] waiting for another process building {cache / name} ...")
                fcntl.flock(f, fcntl.LOCK_EX)
            locked = True
        except OSError:  # a file system without flock: the atomic rename still keeps entries whole
            locked = False
        yield locked  # closing the file releases the lock


def _remove_leftovers(cache: Path, name: str, say: Callable[[str], None]) -> None:
    """Deletes the temporary folders of builds of entry `name` whose process died (killed
    outright, so no cleanup ran). Called only under the entry's lock: no live process is
    writing them. (Entry names hold only [A-Za-z0-9._-], no glob characters.)"""
    leftovers = [p for pattern in (f".{name}.tmp-*", f".{name}.convert-*", f".{name}.old-*")
                 for p in cache.glob(pattern)]
    for p in leftovers:
        shutil.rmtree(p, ignore_errors=True)
    if leftovers:
        say(f"[tensorrt_llm] removed {len(leftovers)} temporary folder(s) of an earlier, interrupted "
            f"build of {name}")


class _LostRace(Exception):
    """Another process renamed the same entry in while this one built it."""


def resolve_engine(model, *, dtype: str = "auto", max_batch_size: Optional[int] = None,
                   max_input_len: Optional[int] = None, max_seq_len: Optional[int] = None,
                   max_num_tokens: Optional[int] = None, max_beam_width: Optional[int] = None,
                   tokens_per_block: Optional[int] = None, cache_dir=None,
                   progress: Optional[Callable[[str], None]] = print,
                   tensor_parallel_size: Optional[int] = None,
                   pipeline_parallel_size: Optional[int] = None) -> ResolvedModel:
    """The engine folder for `model`: an engine folder, a checkpoint folder, a Hugging Face
    model folder or a GGUF file (a local path; see the module docstring), building it into the
    cache on a miss.

    dtype: "auto" (float32 on a machine without CUDA; on a GPU the checkpoint's or Hugging Face
        config's float16/bfloat16, else bfloat16, and float32 for GGUF, the converter's choice),
        or float32 / float16 / bfloat16.
    Build options (None: the default; see build_config_for): max_batch_size (64 on a GPU, 8 on
        the CPU), max_seq_len (the model's max_position_embeddings capped at 4096 on a GPU,
        2048 on the CPU), max_input_len (max_seq_len), max_num_tokens (batch x input capped at
        8192, at least max_input_len), max_beam_width (1), tokens_per_block (32). The engine
        targets this machine's GPU, or any device on a machine without one.
    An engine folder is returned as it is: a build option or dtype that contradicts what it was
        built with is a ConfigError (one that agrees is accepted).
    cache_dir: where built engines are kept (default $TRTLLM_CACHE_DIR, else
        ~/.cache/tensorrt_llm/engines).
    progress: called with one line per stage (a cache hit is one line; a miss says each of
        convert, build and saved with its seconds); None is silent.
    tensor_parallel_size, pipeline_parallel_size: the ranks a Hugging Face folder or GGUF file
        is split over (tp x pp rank files; an unset one is 1); an engine or checkpoint folder
        must have that split when either is given, and keeps its own when neither is
        (`folder_split`).

    Raises ConfigError for a path that does not exist (a hub name is never downloaded) or is
    none of the four kinds, and for options out of range; the converters' CheckpointError and
    the loaders' EngineError for sources that are damaged or hostile.
    """
    say = progress if progress is not None else (lambda _line: None)
    options = {"max_batch_size": max_batch_size, "max_input_len": max_input_len, "max_seq_len": max_seq_len,
               "max_num_tokens": max_num_tokens, "max_beam_width": max_beam_width,
               "tokens_per_block": tokens_per_block}
    _check_options(dtype, options)
    asked = _asked_mapping(tensor_parallel_size, pipeline_parallel_size)
    path = local_path(model)
    kind = detect_kind(path)
    if kind == "engine":
        _check_engine_options(path, options, dtype, asked)
        return _resolved(path, kind, built=False)
    if kind == "checkpoint":
        built = checkpoint_config(path).mapping
        _check_mapping(f"checkpoint folder {path}", built, asked)
        # The checkpoint's split, its layers per stage included (asked for: only the sizes, checked equal).
        mapping = built.with_rank(0) if asked is None else asked.with_pp_partition(built.pp_partition)
    else:
        mapping = asked or Mapping()

    on_gpu = _on_gpu()
    target = current_device_target() if on_gpu else "any"
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    cache = cache.resolve()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create the engine cache folder {cache} ({e.strerror or e}); "
                          f"pass cache_dir or set ${CACHE_DIR_ENV}") from None
    key = cache_key(path, kind, options, dtype, target, mapping)
    entry = cache / _entry_name(path, key)
    if _engine_ready(entry):
        say(f"[tensorrt_llm] engine for {path} found in the cache: {entry}")
        return _resolved(entry, kind, built=False)

    with _build_lock(cache, entry.name, say) as locked:
        if _engine_ready(entry):  # built by another process while we waited for its lock
            say(f"[tensorrt_llm] engine for {path} found in the cache: {entry}")
            return _resolved(entry, kind, built=False)
        if locked:
            _remove_leftovers(cache, entry.name, say)
        if entry.exists():
            say(f"[tensorrt_llm] cache entry {entry} does not read as an engine; rebuilding it")
        try:
            _build_entry(path, kind, entry, cache, options, dtype, on_gpu, target, key, say, mapping)
        except _LostRace:
            say(f"[tensorrt_llm] another process built {entry} first; using that engine")
            return _resolved(entry, kind, built=False)
    return _resolved(entry, kind, built=True)


def _build_entry(path: Path, kind: str, entry: Path, cache: Path, options: dict, dtype: str,
                 on_gpu: bool, target: str, key: str, say: Callable[[str], None],
                 mapping: Optional[Mapping] = None) -> None:
    t_start = time.perf_counter()
    seconds = {}
    if kind == "checkpoint":
        config = checkpoint_config(path)
        build_dtype = dtype if dtype != "auto" else _auto_dtype(kind, config.dtype, on_gpu)
    else:
        config, rank_weights = _source(path, kind, dtype, on_gpu, mapping)
        build_dtype = config.dtype  # converted to it
    build_config = build_config_for(options, config.max_position_embeddings, on_gpu, target)
    # Limits that do not fit the model are refused before any weight is converted.
    resolved = check_build(config, build_config, build_dtype)
    with tempfile.TemporaryDirectory(prefix=f".{entry.name}.convert-", dir=cache) as scratch:
        checkpoint = path
        if kind != "checkpoint":
            t0 = time.perf_counter()
            say(f"[tensorrt_llm] converting {path} ({'Hugging Face folder' if kind == 'hf' else 'GGUF'}) "
                f"to a {build_dtype} checkpoint ...")
            checkpoint = Path(scratch) / "checkpoint"
            # A generator: each rank is converted, written and freed before the next.
            write_checkpoint(checkpoint, config, (rank_weights(r) for r in range(config.mapping.world_size)))
            seconds["convert"] = time.perf_counter() - t0
            say(f"[tensorrt_llm] converted in {seconds['convert']:.1f} s")
        config = checkpoint_config(checkpoint)  # as trtllm-build reads it
        with atomic_output_dir(entry, sources=[path]) as tmp:
            t0 = time.perf_counter()
            say(f"[tensorrt_llm] building the engine ({build_dtype}, max_batch_size "
                f"{resolved.max_batch_size}, max_seq_len {resolved.max_seq_len}, max_input_len "
                f"{resolved.max_input_len}, max_num_tokens {resolved.max_num_tokens}, target "
                f"{resolved.target_device}) ...")
            build_engines(checkpoint, tmp, config, build_config,
                          dtype=None if build_dtype == config.dtype else build_dtype, log=say)
            seconds["build"] = time.perf_counter() - t0
            say(f"[tensorrt_llm] built in {seconds['build']:.1f} s")
            t0 = time.perf_counter()
            tokenizer = _save_tokenizer(checkpoint if kind == "checkpoint" else path, tmp, say)
            info = {"source": str(path), "kind": kind, "key": key, "package_version": __version__,
                    "dtype": build_dtype, "build_config": resolved.to_dict(), "tokenizer": tokenizer,
                    "seconds": {k: round(v, 3) for k, v in seconds.items()},
                    "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2))
            if _engine_ready(entry):
                raise _LostRace()  # atomic_output_dir deletes our copy
        seconds["save"] = time.perf_counter() - t0
    say(f"[tensorrt_llm] saved to {entry} in {seconds['save']:.1f} s "
        f"({time.perf_counter() - t_start:.1f} s in all)")


def _save_tokenizer(source: Path, engine_dir: Path, say: Callable[[str], None]) -> bool:
    """Copies (or, from a GGUF file, converts) the model's tokenizer into the engine folder.
    A tokenizer that cannot be made does not fail the build: the engine still runs on token
    ids, and the line says why there is no tokenizer."""
    try:
        written = save_tokenizer(source, engine_dir)
    except Exception as e:  # transformers' GGUF tokenizer reader raises many kinds
        say(f"[tensorrt_llm] warning: no tokenizer from {source} ({type(e).__name__}: "
            f"{' '.join(str(e).split())[:200]}); the engine runs on token ids only")
        return False
    if not written:
        say(f"[tensorrt_llm] note: {source} has no tokenizer files; the engine runs on token ids only")
    return bool(written)
