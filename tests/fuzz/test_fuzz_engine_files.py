"""Fuzzing engine folders: the graph JSON, the engine metadata, the weight tensors, config.json and
the raw bytes, each mutated with the checksum recomputed (as an attacker would) so the mutation
reaches the validation behind it.

Property: ModelRunner.from_dir plus a short generate either works or raises the project's own
error; never another exception, a hang, or a side effect (the payloads in the string fields
would create a marker file if any of them were executed).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from tensorrt_llm.engine import engine_checksum, engine_configs
from tensorrt_llm.runtime import ModelRunner

from .harness import fuzz_settings, outcome

MARKER = Path("/tmp/trtllm-fuzz-engine-executed")


def payloads() -> list[str]:
    """Strings that run code if they ever reach generated source or an eval."""
    m = str(MARKER)
    return [f"__import__('pathlib').Path({m!r}).touch()",
            f"x=__import__('pathlib').Path({m!r}).touch()",
            f"a'):\n    __import__('pathlib').Path({m!r}).touch()\n#",
            f"x'] = 1; __import__('pathlib').Path({m!r}).touch(); y = ['",
            f"{{__import__('pathlib').Path({m!r}).touch()}}"]


class EngineParts:
    """An engine folder read into parts that a case can change and write back."""

    def __init__(self, engine_dir: Path):
        path = engine_dir / "rank0.engine"
        with safe_open(str(path), framework="pt") as f:
            self.metadata = dict(f.metadata())
            self.tensors = {k: f.get_tensor(k) for k in f.keys()}
        self.graph = json.loads(self.metadata["graph"])
        self.config = json.loads((engine_dir / "config.json").read_text())

    def write(self, engine_dir: Path, both_configs: bool = False) -> None:
        """Writes the folder with the checksum recomputed; `both_configs`: the rank file's
        copy of the configs changed like config.json (what an attacker would do)."""
        engine_dir.mkdir(parents=True, exist_ok=True)
        metadata = dict(self.metadata, graph=json.dumps(self.graph))
        if both_configs:
            copy = (engine_configs(self.config) if isinstance(self.config, dict)
                    and {"pretrained_config", "build_config"} <= set(self.config) else self.config)
            metadata["config"] = json.dumps(copy, sort_keys=True)
        metadata["checksum"] = engine_checksum(metadata, self.tensors)
        save_file(self.tensors, str(engine_dir / "rank0.engine"), metadata=metadata)
        (engine_dir / "config.json").write_text(json.dumps(self.config))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8)
    | st.sampled_from(payloads()),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6) | st.sampled_from(payloads()),
                                                                inner, max_size=3),
    max_leaves=5)
strings = st.text(max_size=10) | st.sampled_from(payloads())


@st.composite
def graph_mutation(draw, graph):
    layers = graph["layers"]
    i = draw(st.integers(0, len(layers) - 1))
    field = draw(st.sampled_from(["op", "name", "inputs", "outputs", "attr_key", "attr_value", "attrs",
                                  "input_spec", "output_name", "tensor_spec", "weight_spec", "drop_layer",
                                  # well-formed lies: they pass the grammar and must be caught behind it
                                  "attr_number", "rewire", "tensor_dim", "swap_op"]))
    if field == "attr_number":
        value = draw(st.one_of(st.integers(-3, 70000), st.floats(-10, 1e6), st.booleans(),
                               st.lists(st.integers(-2, 70000), max_size=4)))
    elif field == "rewire":
        names = [t["name"] for t in graph["inputs"]] + sorted(graph["tensors"])
        value = draw(st.sampled_from(names))
    elif field == "tensor_dim":
        value = draw(st.integers(-1, 70000))
    elif field == "swap_op":
        value = draw(st.sampled_from(sorted({layer["op"] for layer in graph["layers"]})))
    else:
        value = draw(json_values)
    return (field, i, value, draw(strings))


def apply_graph_mutation(graph: dict, mutation) -> None:
    field, i, value, text = mutation
    if not graph["layers"]:
        return
    i %= len(graph["layers"])  # an earlier mutation may have dropped a layer
    layer = graph["layers"][i]
    if field in ("op", "name"):
        layer[field] = text
    elif field in ("inputs", "outputs"):
        if isinstance(layer[field], list) and layer[field]:
            layer[field][0] = text if isinstance(value, (dict, list)) else value
        else:
            layer[field] = value
    elif field == "attr_key":
        if isinstance(layer["attrs"], dict):
            layer["attrs"][text] = value
    elif field == "attr_value":
        if isinstance(layer["attrs"], dict) and layer["attrs"]:
            layer["attrs"][sorted(layer["attrs"], key=str)[0]] = value
    elif field == "attrs":
        layer["attrs"] = value
    elif field == "input_spec":
        spec = graph["inputs"][i % len(graph["inputs"])]
        spec[sorted(spec)[len(text) % len(spec)]] = value
    elif field == "output_name":
        graph["outputs"][0] = text
    elif field == "tensor_spec":
        name = sorted(graph["tensors"])[i % len(graph["tensors"])]
        graph["tensors"][name][sorted(graph["tensors"][name])[len(text) % 2]] = value
    elif field == "weight_spec":
        name = sorted(graph["weights"])[i % len(graph["weights"])]
        graph["weights"][text] = graph["weights"].pop(name)
    elif field == "drop_layer":
        del graph["layers"][i]
    elif field == "attr_number":
        if isinstance(layer["attrs"], dict) and layer["attrs"]:
            layer["attrs"][sorted(layer["attrs"], key=str)[len(text) % len(layer["attrs"])]] = value
    elif field == "rewire":
        if isinstance(layer["inputs"], list) and layer["inputs"]:
            layer["inputs"][len(text) % len(layer["inputs"])] = value
    elif field == "tensor_dim":
        spec = graph["tensors"][sorted(graph["tensors"])[i % len(graph["tensors"])]]
        if isinstance(spec.get("shape"), list) and spec["shape"]:
            spec["shape"][len(text) % len(spec["shape"])] = value
    elif field == "swap_op":
        layer["op"] = value


@pytest.fixture(scope="module")
def parts(tiny_engine_dir) -> EngineParts:
    return EngineParts(tiny_engine_dir)


def load_and_generate(engine_dir: Path) -> None:
    runner = ModelRunner.from_dir(engine_dir, device="cpu")
    runner.generate([[1, 2, 3]], max_new_tokens=2)


def check(engine_dir: Path, describe: str) -> str:
    MARKER.unlink(missing_ok=True)
    result = outcome(lambda: load_and_generate(engine_dir), describe)
    assert not MARKER.exists(), f"{describe}: a string from the engine file was executed"
    return result


def fresh(parts: EngineParts) -> EngineParts:
    copy = object.__new__(EngineParts)
    copy.metadata = dict(parts.metadata)
    copy.tensors = dict(parts.tensors)
    copy.graph = json.loads(json.dumps(parts.graph))
    copy.config = json.loads(json.dumps(parts.config))
    return copy


def test_unchanged_engine_loads_and_generates(parts, tmp_path):
    fresh(parts).write(tmp_path / "e")
    assert check(tmp_path / "e", "unchanged") == "ok"


@fuzz_settings(examples=2500)
@given(data=st.data())
def test_graph_mutations_load_or_raise_engine_errors(parts, tmp_path, data):
    p = fresh(parts)
    mutations = data.draw(st.lists(graph_mutation(p.graph), min_size=1, max_size=3))
    for m in mutations:
        apply_graph_mutation(p.graph, m)
    shutil.rmtree(tmp_path / "e", ignore_errors=True)
    p.write(tmp_path / "e")
    check(tmp_path / "e", f"graph mutated by {mutations}")


@fuzz_settings(examples=800)
@given(data=st.data())
def test_metadata_tensor_and_config_mutations_load_or_raise_engine_errors(parts, tmp_path, data):
    p = fresh(parts)
    kind = data.draw(st.sampled_from(["metadata", "drop_tensor", "tensor_dtype", "tensor_shape", "extra_tensor",
                                      "config_set", "config_delete", "config_whole", "pretrained_set",
                                      "build_set"]))
    value = data.draw(json_values)
    if kind == "metadata":
        key = data.draw(st.sampled_from(sorted(p.metadata) + ["other"]))
        p.metadata[key] = data.draw(strings)
    elif kind.endswith("tensor") or kind.startswith("tensor"):
        name = data.draw(st.sampled_from(sorted(p.tensors)))
        t = p.tensors[name]
        if kind == "drop_tensor":
            del p.tensors[name]
        elif kind == "tensor_dtype":
            p.tensors[name] = t.to(data.draw(st.sampled_from([torch.float16, torch.int32, torch.int8, torch.float64])))
        elif kind == "tensor_shape":
            p.tensors[name] = t.reshape(-1)[: max(1, t.numel() // 2)].clone()
        else:
            p.tensors[data.draw(strings) or "x"] = torch.zeros(3)
    elif kind == "config_set":
        p.config[data.draw(st.sampled_from(sorted(p.config)))] = value
    elif kind == "config_delete":
        del p.config[data.draw(st.sampled_from(sorted(p.config)))]
    elif kind == "config_whole":
        p.config = value
    else:
        section = p.config["pretrained_config" if kind == "pretrained_set" else "build_config"]
        section[data.draw(st.sampled_from(sorted(section)))] = value
    both = data.draw(st.booleans())
    shutil.rmtree(tmp_path / "e", ignore_errors=True)
    p.write(tmp_path / "e", both_configs=both)
    check(tmp_path / "e", f"{kind} mutated to {value!r} (rank file's copy too: {both})")


@fuzz_settings(examples=400)
@given(cut=st.floats(0, 1), flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), max_size=3))
def test_damaged_engine_bytes_are_refused(tiny_engine_dir, tmp_path, cut, flips):
    shutil.rmtree(tmp_path / "e", ignore_errors=True)
    shutil.copytree(tiny_engine_dir, tmp_path / "e")
    path = tmp_path / "e" / "rank0.engine"
    data = bytearray(path.read_bytes())
    for at, byte in flips:
        data[int(at * (len(data) - 1))] = byte
    if cut < 0.5:
        data = data[: int(cut * 2 * len(data))]
    path.write_bytes(bytes(data))
    check(tmp_path / "e", f"engine bytes cut at {cut}, flipped {flips}")


# Cases the fuzzers found escaping as other exceptions (now refused at load): the regression corpus.
FOUND_GRAPH_MUTATIONS = [
    [("attr_value", 0, [], "")],                                    # a constant's weight name made a list
    [("attr_value", 2, None, ""), ("attr_value", 6, True, "")],     # split's dim a bool
    [("attr_number", 2, 0, ""), ("rewire", 2, "last_token_ids", "")],  # batch-sized rows where tokens belong
    [("rewire", 19, "silu_and_mul_linear_38_output_0", "")],        # logits no longer one row per request
]


@pytest.mark.parametrize("mutations", FOUND_GRAPH_MUTATIONS, ids=range(len(FOUND_GRAPH_MUTATIONS)))
def test_found_graph_mutations_are_refused(parts, tmp_path, mutations):
    p = fresh(parts)
    for m in mutations:
        apply_graph_mutation(p.graph, m)
    p.write(tmp_path / "e")
    assert check(tmp_path / "e", f"graph mutated by {mutations}").startswith("EngineError")


def test_found_mapping_without_its_fields_is_refused(parts, tmp_path):
    p = fresh(parts)
    p.config["pretrained_config"]["mapping"] = {}  # loaded, then a KeyError in the runtime
    p.write(tmp_path / "e", both_configs=True)
    assert check(tmp_path / "e", "mapping {}").startswith("EngineError")
