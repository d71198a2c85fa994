"""The engine file format: an `Engine` (one rank's built network and its configuration),
saved and loaded.

An engine is data, never code: `config.json` (what was built and how) plus one
`rank{N}.engine` per rank, a safetensors file whose tensors are the weights and whose
metadata holds the graph (JSON), the format and package versions, the target device, the
model and build configs (`config`: the copy config.json must agree with), a checksum over
all of that metadata and the weights, and the refit map (how each weight derives from the
checkpoint, for tensorrt_llm/refit.py). Loading never unpickles, never imports model code
and never runs anything the file says: the graph must pass engine_check's grammar, and the
configs must be well-formed, agree with each other and with the graph (docs/security.md).
The checksum, stored in the same file, detects damage, not tampering.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ._utils import read_json_object
from .build_config import BuildConfig, current_device_target
from .engine_check import (
    check_config_matches_graph,
    check_constant_indices,
    check_engine_config,
    check_graph,
    check_shapes,
    config_differences,
)
from .errors import EngineError
from .network import Network
from .version import __version__

# 2: the metadata holds the model and build configs, and the checksum covers all metadata.
ENGINE_FORMAT_VERSION = 2


def check_target(target: str, device: torch.device) -> None:
    """Refuse an engine built for a GPU architecture that is not the one we run on."""
    if target == "any":
        return
    if device.type != "cuda":
        raise EngineError(f"engine was built for {target} but is being loaded on {device}; "
                          f"rebuild it with --target_device any (or on this machine)")
    here = current_device_target()
    if here != target:
        raise EngineError(f"engine was built for {target} but this GPU is {here}; "
                          f"rebuild the engine on this machine")


class _Checksum:
    """sha256 over the metadata (every entry but the checksum, as sorted JSON) and every
    weight (name, dtype, shape, bytes), in name order."""

    def __init__(self, metadata: dict[str, str]):
        text = json.dumps({k: v for k, v in metadata.items() if k != "checksum"}, sort_keys=True)
        self._h = hashlib.sha256(text.encode())

    def add(self, name: str, t: torch.Tensor) -> None:
        self._h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        t = t.detach().contiguous()
        if t.device.type != "cpu":
            t = t.cpu()
        self._h.update(t.reshape(-1).view(torch.uint8).numpy().data)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


def engine_checksum(metadata: dict[str, str], weights: dict[str, torch.Tensor]) -> str:
    """The checksum a rank file stores: it detects a damaged or truncated file. It is no
    protection against a deliberate edit, which can recompute it (docs/security.md)."""
    h = _Checksum(metadata)
    for name in sorted(weights):
        h.add(name, weights[name])
    return h.hexdigest()


# Metadata entries of a rank file; any other is refused at load.
METADATA_KEYS = {"format_version", "package_version", "target_device", "graph", "config", "checksum",
                 "refit_map"}


def engine_configs(config: dict) -> dict:
    """The part of an engine's config that its rank files hold a copy of (and check
    config.json against): what the graph was built from and with."""
    return {"pretrained_config": config["pretrained_config"], "build_config": config["build_config"]}


class Engine:
    """One rank's built network plus the configuration it was built with."""

    def __init__(self, config: dict, network: Network, rank: int = 0, refit_map: Optional[dict] = None):
        self.config = config
        self.network = network
        self.rank = rank
        self.refit_map = refit_map  # see refit_map(); None: the engine cannot be refitted

    @property
    def build_config(self) -> BuildConfig:
        return BuildConfig.from_dict(self.config["build_config"])

    @property
    def pretrained_config(self) -> dict:
        return self.config["pretrained_config"]

    def save(self, engine_dir: str | os.PathLike) -> Path:
        engine_dir = Path(engine_dir)
        engine_dir.mkdir(parents=True, exist_ok=True)
        graph = self.network.to_json()
        weights = {k: v.detach().contiguous().cpu() for k, v in self.network.weights.items()}
        metadata = {
            "format_version": str(ENGINE_FORMAT_VERSION),
            "package_version": __version__,
            "target_device": self.config["build_config"]["target_device"],
            "graph": graph,
            "config": json.dumps(engine_configs(self.config), sort_keys=True),
        }
        if self.refit_map is not None:
            metadata["refit_map"] = json.dumps(self.refit_map)
        metadata["checksum"] = engine_checksum(metadata, weights)
        # Write next to the final name and rename, so a failed save never leaves a
        # half-written engine where a good one is expected.
        path = engine_dir / f"rank{self.rank}.engine"
        tmp = path.with_suffix(".engine.tmp")
        save_file(weights, str(tmp), metadata=metadata)
        os.replace(tmp, path)
        config = dict(self.config, version={"format": ENGINE_FORMAT_VERSION, "package": __version__})
        tmp = engine_dir / f"config.json.{self.rank}.tmp"  # ranks may be saved at once (--workers)
        tmp.write_text(json.dumps(config, indent=2))
        os.replace(tmp, engine_dir / "config.json")
        return path

    @classmethod
    def from_dir(cls, engine_dir: str | os.PathLike, rank: int = 0, device="cpu") -> "Engine":
        """Load and verify one rank; weights are placed on `device` directly.

        Nothing of the file runs: the graph is checked against engine_check's grammar, the
        configs for their types, config.json against the rank file's copy, and both against
        the graph, before a Network is made of it; any failure is one EngineError."""
        engine_dir = Path(engine_dir)
        config = read_engine_config(engine_dir)
        path = engine_dir / f"rank{rank}.engine"
        if not path.is_file():
            raise EngineError(f"{path} is missing (the engine has "
                              f"{config['pretrained_config']['mapping']['world_size']} rank(s))")
        device = torch.device(device)
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                check_versions(meta.get("format_version"), meta.get("package_version"), path)
                unknown = sorted(set(meta) - METADATA_KEYS)
                if unknown or "graph" not in meta or "config" not in meta:
                    what = f"unknown metadata {unknown}"[:120] if unknown else "no graph or config"
                    raise EngineError(f"{path} holds {what}: it is not an engine of this format; rebuild it")
                check_target(meta.get("target_device", "any"), device)
                # One tensor at a time: hashed on the host, then moved, so host memory
                # never holds more than one weight beyond the mapped file.
                checksum = _Checksum(meta)
                weights = {}
                for name in sorted(f.keys()):
                    t = f.get_tensor(name)
                    checksum.add(name, t)
                    weights[name] = t.to(device) if device.type != "cpu" else t
        except EngineError:
            raise
        except Exception as e:  # safetensors raises its own types for truncated headers/data
            raise EngineError(f"{path} is truncated or corrupted ({e}); rebuild the engine") from e
        if meta.get("checksum") != checksum.hexdigest():
            raise EngineError(f"{path} fails its checksum: the file was altered or damaged; "
                              f"rebuild the engine")
        # The checksum says the file is as it was written, not who wrote it: everything
        # below treats the metadata as a stranger's.
        try:
            graph = json.loads(meta["graph"])
            own = json.loads(meta["config"])
            refit = json.loads(meta["refit_map"]) if "refit_map" in meta else None
        except ValueError as e:
            raise EngineError(f"{path}: metadata is not valid JSON ({e}); rebuild the engine") from None
        check_graph(graph, str(path))
        pretrained, build_config = check_engine_config(own, f"{path} (its config copy)")
        if build_config["target_device"] != meta.get("target_device", "any"):
            raise EngineError(f"{path}: its target device {meta.get('target_device')!r} is not its build "
                              f"config's {build_config['target_device']!r}; rebuild the engine")
        _check_config_copy(engine_dir, path, config, own)
        if refit is not None and not _is_refit_map(refit):
            raise EngineError(f"{path}: its refit map is malformed; rebuild the engine")
        try:
            network = Network.from_dict(graph, weights)
        except (ValueError, KeyError, TypeError) as e:
            raise EngineError(f"{path}: the graph does not load ({' '.join(str(e).split())[:300]}); "
                              f"rebuild the engine") from None
        check_shapes(network, str(path))
        check_constant_indices(network, str(path))
        check_config_matches_graph(pretrained, build_config, network, str(path), rank)
        return cls(config, network, rank, refit_map=refit)


def _is_refit_map(refit) -> bool:
    """{"sources": {name: [name or [name, rows]]}, "checkpoint": {name: [dtype, shape]},
    "equal": {name: name}} (builder.refit_map; refit.py reads it). Engines from before
    "equal" existed have none."""
    def is_source(s):
        return isinstance(s, str) or (isinstance(s, list) and len(s) == 2 and isinstance(s[0], str)
                                      and isinstance(s[1], int))

    equal = refit.get("equal", {}) if isinstance(refit, dict) else None
    return (isinstance(refit, dict) and set(refit) - {"equal"} == {"sources", "checkpoint"}
            and isinstance(refit["sources"], dict) and isinstance(refit["checkpoint"], dict)
            and all(isinstance(v, list) and all(map(is_source, v)) for v in refit["sources"].values())
            and all(isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], list)
                    for v in refit["checkpoint"].values())
            and isinstance(equal, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in equal.items()))


def check_versions(format_version, package_version, where) -> None:
    if str(format_version) != str(ENGINE_FORMAT_VERSION):
        raise EngineError(f"{where} has engine format version {format_version}, this runtime reads "
                          f"version {ENGINE_FORMAT_VERSION}; rebuild the engine with trtllm-build")
    if package_version != __version__:
        raise EngineError(f"{where} was built by tensorrt_llm {package_version}, this is "
                          f"tensorrt_llm {__version__}; rebuild the engine with trtllm-build")


def _check_config_copy(engine_dir: Path, path: Path, config: dict, own: dict) -> None:
    differ = config_differences(engine_configs(config), engine_configs(own))
    if differ:
        shown = ", ".join(differ[:6]) + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")
        raise EngineError(f"{engine_dir / 'config.json'} disagrees with {path.name} on {shown}: "
                          f"config.json was edited; restore it or rebuild the engine")


def check_config_copy(engine_dir, rank: int = 0) -> None:
    """config.json against rank `rank`'s copy of it, reading the rank file's metadata only
    (no weights): EngineError when they differ (Engine.from_dir checks the same, and more)."""
    engine_dir = Path(engine_dir)
    config = read_engine_config(engine_dir)
    path = engine_dir / f"rank{rank}.engine"
    try:
        with safe_open(str(path), framework="pt") as f:
            own = json.loads((f.metadata() or {})["config"])
    except Exception:  # missing, damaged, not an engine: Engine.from_dir says which
        return
    _check_config_copy(engine_dir, path, config, own)


def read_engine_config(engine_dir: Path) -> dict:
    """config.json of an engine folder, refused (EngineError naming the problem) when it is
    not JSON, not an object, of another version, or of malformed configs."""
    path = Path(engine_dir) / "config.json"
    if not path.is_file():
        raise EngineError(f"{path} not found: is {engine_dir} an engine folder made by trtllm-build?")
    config = read_json_object(path, EngineError, "; restore the engine's config.json or rebuild the engine")
    version = config.get("version")
    if not isinstance(version, dict):
        raise EngineError(f"{path} has no version object: it was not written by trtllm-build; "
                          f"rebuild the engine")
    check_versions(version.get("format"), version.get("package"), path)
    check_engine_config(config, str(path))
    return config
