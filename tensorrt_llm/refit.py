"""Refit: put a checkpoint's weights into a built engine without rebuilding it.

The builder records in each rank file how every engine weight derives from checkpoint
weights (`builder.refit_map`: the same tensor, or several concatenated along dim 0 by a
fusion, a per-tensor FP8 scale repeated over its rows where a fused scale is per channel; and
the checkpoint tensors a fused engine reads once for two, which must be equal). Refitting
follows that record, so no model code runs and the graph and the
model's own constants (e.g. the rotary table) stay as built. A checkpoint whose config,
weight names, shapes or dtypes differ from what the engine was built from is refused. An FP8
checkpoint's float8_e4m3fn codes fit the engine's uint8 weights (engines hold the codes' bytes).

Every rank is written to a staging folder first (with a fresh checksum) and moved into
place only when all ranks succeeded, so a failed refit leaves the engine as it was.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open

from .builder import Engine, read_engine_config
from .engine_check import constant_index_problem
from .errors import EngineError, TrtLlmError
from .graph_rewriting import tiled_code_weights
from .models.modeling_utils import CONFIG_NAME, PretrainedConfig, check_safetensors_file, rank_weights_name
from .ops.quantized_linear import tile_codes
from .quantization.formats import FP8_DTYPE


class RefitError(TrtLlmError, ValueError):
    """The checkpoint does not fit the engine; the message lists every difference."""


def refit_engine(engine_dir, checkpoint_dir, output_dir=None) -> dict:
    """Write the engine of `engine_dir` with the weights of `checkpoint_dir` into
    `output_dir` (default: in place). Returns {"output_dir", "ranks", "weights_replaced",
    "weights_kept"} (the last two summed over ranks)."""
    engine_dir, checkpoint_dir = Path(engine_dir), Path(checkpoint_dir)
    output_dir = Path(output_dir) if output_dir is not None else engine_dir
    config = read_engine_config(engine_dir)
    _check_config(config["pretrained_config"], PretrainedConfig.from_checkpoint(checkpoint_dir))
    world = config["pretrained_config"]["mapping"]["world_size"]
    report = {"output_dir": output_dir, "ranks": world, "weights_replaced": 0, "weights_kept": 0}
    output_dir.mkdir(parents=True, exist_ok=True)
    # In the output folder, so that the final renames stay on one file system.
    staging = Path(tempfile.mkdtemp(prefix=".refit-", dir=output_dir))
    try:
        for rank in range(world):
            engine = Engine.from_dir(engine_dir, rank)  # verifies the checksum
            replaced = _swap_weights(engine, checkpoint_dir / rank_weights_name(rank))
            report["weights_replaced"] += replaced
            report["weights_kept"] += len(engine.network.weights) - replaced
            engine.config = dict(engine.config, refit={"checkpoint_dir": str(checkpoint_dir.resolve())})
            engine.save(staging)
            del engine  # one rank's weights in memory at a time
        if output_dir.resolve() != engine_dir.resolve():
            _copy_other_files(engine_dir, output_dir, world)
        for rank in range(world):
            name = f"rank{rank}.engine"
            os.replace(staging / name, output_dir / name)
        os.replace(staging / CONFIG_NAME, output_dir / CONFIG_NAME)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


def _check_config(engine_config: dict, checkpoint: PretrainedConfig) -> None:
    """The graph is kept as built, so every config field must already agree with it."""
    new = json.loads(json.dumps(checkpoint.to_dict()))  # tuples -> lists, as in config.json
    keys = sorted(set(engine_config) | set(new))
    diffs = [f"{k}: engine {engine_config.get(k)!r}, checkpoint {new.get(k)!r}"
             for k in keys if engine_config.get(k) != new.get(k)]
    if diffs:
        raise RefitError("the checkpoint's config differs from the engine's (rebuild instead, or "
                         "convert the checkpoint with the engine's settings):\n  " + "\n  ".join(diffs))


def _swap_weights(engine: Engine, path: Path) -> int:
    """Replace `engine`'s checkpoint-derived weights with those of the rank file `path`,
    after checking all names, shapes and dtypes. Returns how many weights it replaced."""
    refit = engine.refit_map
    if refit is None:
        raise EngineError(f"rank {engine.rank} of the engine records no refit map (built before "
                          f"refit existed, or by a rewrite that does not record its sources); "
                          f"rebuild the engine")
    if not path.is_file():
        raise RefitError(f"{path} not found: the checkpoint has fewer ranks than the engine")
    expected = refit["checkpoint"]
    check_safetensors_file(path)  # a cut-off file is named as truncated, before any tensor is read
    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
        problems = [f"missing: {n}" for n in sorted(set(expected) - names)]
        problems += [f"unexpected: {n}" for n in sorted(names - set(expected))]
        tensors = {}
        for name in sorted(names & set(expected)):
            t = f.get_tensor(name)
            dtype, shape = expected[name]
            if t.dtype == FP8_DTYPE and dtype == "uint8":
                t = t.view(torch.uint8)  # FP8 codes: engines hold their bytes (layers/linear.py, Fp8Codes)
            # Our dtype names are torch's; a dtype we do not support still gets named.
            got = str(t.dtype).removeprefix("torch.")
            if got != dtype or list(t.shape) != shape:
                problems.append(f"{name}: engine has {dtype} {shape}, checkpoint has {got} {list(t.shape)}")
            tensors[name] = t
    for unread, read in refit.get("equal", {}).items():
        if unread in tensors and read in tensors and not torch.equal(tensors[unread], tensors[read]):
            problems.append(f"{unread} differs from {read}, which the engine reads for both (a fused "
                            f"gate/up FP8 scale); rebuild instead")
    if problems:
        raise RefitError(f"{path} does not fit rank {engine.rank} of the engine "
                         f"({len(problems)} problem(s)):\n  " + "\n  ".join(problems))
    weights = engine.network.weights
    tiled = tiled_code_weights(engine.network)  # an engine saved after a GPU load: codes in tile order

    def source(s):
        return tensors[s] if isinstance(s, str) else tensors[s[0]].expand(s[1])  # [name, rows]: [1] repeated

    for name, sources in refit["sources"].items():
        value = source(sources[0]) if len(sources) == 1 else torch.cat([source(s) for s in sources])
        if value.dtype != weights[name].dtype or value.shape != weights[name].shape:
            raise EngineError(f"the engine's refit map builds {name} as {value.dtype} "
                              f"{list(value.shape)} but the engine holds {weights[name].dtype} "
                              f"{list(weights[name].shape)}: the engine is inconsistent; rebuild it")
        weights[name] = tile_codes(value) if name in tiled else value
    problem = constant_index_problem(engine.network)  # an act-order perm out of range: as a load would refuse it
    if problem is not None:
        raise RefitError(f"{path}: {problem}; the checkpoint cannot be refitted into this engine")
    return len(refit["sources"])


def _copy_other_files(engine_dir: Path, output_dir: Path, world: int) -> None:
    """Tokenizer files and the like travel with the engine to its new folder."""
    engine_files = {CONFIG_NAME} | {f"rank{r}.engine" for r in range(world)}
    for path in engine_dir.iterdir():
        if path.is_file() and path.name not in engine_files:
            shutil.copy2(path, output_dir / path.name)
