"""Engines from strangers: a crafted engine never runs code at load, an edited config.json is
refused naming the field, and trtllm-build refuses or warns about a KV cache that cannot fit.

A crafted engine here is what an attacker can make: the rank file rewritten with a changed
graph or config and its checksum recomputed exactly as the builder computes it (the checksum
lives in the same file, so it proves nothing about who wrote it)."""
import json
import re

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tensorrt_llm.cli import run_cli
from tensorrt_llm.commands import build as build_cmd
from tensorrt_llm.engine import Engine, engine_checksum
from tensorrt_llm.engine_check import NAME_PATTERN, check_graph, op_signatures
from tensorrt_llm.errors import ConfigError, EngineError
from tensorrt_llm.models.llama.convert import config_from_hf, load_weights_from_hf
from tensorrt_llm.models.modeling_utils import save_checkpoint
from tensorrt_llm.network import Network
from tensorrt_llm.ops import references
from tensorrt_llm.runtime import ModelRunner, Session

from ..models.llama_utils import engine_from_hf, random_hf_llama

SHAPE = dict(num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="module")
def hf():
    return random_hf_llama(seed=3, **SHAPE)


@pytest.fixture(scope="module")
def built(hf, tmp_path_factory):
    return engine_from_hf(hf, tmp_path_factory.mktemp("safety") / "engine")


@pytest.fixture
def engine_dir(built, tmp_path):
    copy = tmp_path / "engine"
    copy.mkdir()
    for p in built.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    return copy


def craft(engine_dir, edit_graph=None, edit_config=None):
    """Rewrite rank0.engine with an edited graph / config copy and a recomputed checksum."""
    path = engine_dir / "rank0.engine"
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
        weights = {k: f.get_tensor(k) for k in f.keys()}
    if edit_graph is not None:
        graph = json.loads(meta["graph"])
        edit_graph(graph, weights)
        meta["graph"] = json.dumps(graph)
    if edit_config is not None:
        config = json.loads(meta["config"])
        edit_config(config)
        meta["config"] = json.dumps(config)
    meta["checksum"] = engine_checksum(meta, weights)
    save_file(weights, str(path), metadata=meta)


def edit_config_json(engine_dir, edit):
    path = engine_dir / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


def first_layer(graph, op=None, with_attrs=False):
    for layer in graph["layers"]:
        if (op is None or layer["op"] == op) and layer["op"] != "constant" and (layer["attrs"] or not with_attrs):
            return layer
    raise AssertionError(f"no layer of op {op}")


def rename_tensor(graph, old, new):
    for spec in graph["inputs"]:
        if spec["name"] == old:
            spec["name"] = new
    if old in graph["tensors"]:
        graph["tensors"][new] = graph["tensors"].pop(old)
    for layer in graph["layers"]:
        layer["inputs"] = [new if n == old else n for n in layer["inputs"]]
        layer["outputs"] = [new if n == old else n for n in layer["outputs"]]
    graph["outputs"] = [new if n == old else n for n in graph["outputs"]]


def payloads(marker):
    """Strings that, pasted into the old generated plan source, would have run code when it
    was compiled and exec'd (the attribute-key one did: it closes the call and adds a
    statement at module level, then opens a new function for the rest of the plan)."""
    cmd = f"__import__('os').system('touch {marker}')"
    return {
        "statement": f"_x=1)\n{cmd}\ndef _rest(feed):\n    dict(_y",
        "expression": f"x'] or {cmd} or feed['x",
        "open": f"open('{marker}', 'w')",
    }


def attr_key(graph, weights, payload):
    layer = first_layer(graph, with_attrs=True)
    layer["attrs"][payload] = 1e-5


def attr_value(graph, weights, payload):
    layer = first_layer(graph, with_attrs=True)
    key = sorted(layer["attrs"])[0]
    layer["attrs"][key] = payload


def op_name(graph, weights, payload):
    first_layer(graph)["op"] = payload


def layer_name(graph, weights, payload):
    first_layer(graph)["name"] = payload


def input_name(graph, weights, payload):
    rename_tensor(graph, "input_ids", payload)


def output_name(graph, weights, payload):
    rename_tensor(graph, "logits", payload)


def layer_input(graph, weights, payload):
    first_layer(graph)["inputs"][0] = payload


def layer_output(graph, weights, payload):
    first_layer(graph)["outputs"][0] = payload


def tensor_name(graph, weights, payload):
    rename_tensor(graph, first_layer(graph)["outputs"][0], payload)


def weight_key(graph, weights, payload):
    name = "transformer.ln_f.weight" if "transformer.ln_f.weight" in weights else sorted(weights)[0]
    weights[payload] = weights.pop(name)
    graph["weights"][payload] = graph["weights"].pop(name)
    for layer in graph["layers"]:
        if layer["op"] == "constant" and layer["attrs"]["weight"] == name:
            layer["attrs"]["weight"] = payload


def implementation(graph, weights, payload):
    first_layer(graph, "rms_norm_linear")["attrs"]["implementation"] = payload


# field -> (edit, what the one-line refusal says)
FIELDS = {
    "attribute key": (attr_key, r"has attribute .* which op \w+ does not take"),
    "attribute value": (attr_value, r"'s attribute \w+ .* is not a valid name"),
    "op name": (op_name, r"has op .* which is not an op of this runtime"),
    "layer name": (layer_name, r"layer \d+'s name .* is not a valid name"),
    "input name": (input_name, r"input 0's name .* is not a valid name"),
    "output name": (output_name, r"tensor .* is not a valid name"),
    "layer input": (layer_input, r"'s input .* is not a valid name"),
    "layer output": (layer_output, r"'s output .* is not a valid name"),
    "tensor name": (tensor_name, r"tensor .* is not a valid name"),
    "weight key": (weight_key, r"weight .* is not a valid name"),
    "implementation": (implementation, r"names implementation .* not one of \[[^]]*'reference'[^]]*\]"),
}


@pytest.mark.parametrize("kind", ["statement", "expression", "open"])
@pytest.mark.parametrize("field", sorted(FIELDS))
def test_code_in_any_string_of_the_graph_is_refused_and_never_runs(engine_dir, tmp_path, field, kind):
    marker = tmp_path / "pwned"
    edit, refusal = FIELDS[field]
    craft(engine_dir, lambda graph, weights: edit(graph, weights, payloads(marker)[kind]))
    with pytest.raises(EngineError) as e:
        ModelRunner.from_dir(engine_dir, device="cpu")
    message = str(e.value)
    assert "\n" not in message and "graph refused" in message and "rank0.engine" in message
    assert re.search(refusal, message), message
    assert not marker.exists()


def test_the_plan_source_holds_no_string_of_the_file(built):
    source = ModelRunner.from_dir(built, device="cpu").session.source
    assert "'" not in source and '"' not in source
    graph = Engine.from_dir(built).network
    for name in ["input_ids", "logits", "rms_norm", "gpt_attention"] + [layer.name for layer in graph.layers[:5]]:
        assert name not in source, name


@pytest.mark.parametrize("kind", ["statement", "expression", "open"])
def test_lowering_alone_never_writes_an_attribute_key_into_the_source(built, tmp_path, kind):
    """Defence in depth: a network that skipped the grammar check (made in-process, or read
    by a path that does not check) still cannot put code into the plan through its attrs."""
    marker = tmp_path / "pwned"
    payload = payloads(marker)[kind]
    engine = Engine.from_dir(built)
    data = json.loads(json.dumps(engine.network.to_dict()))
    layer = first_layer(data, "rms_norm_linear")
    layer["attrs"][payload] = payload
    network = Network.from_dict(data, dict(engine.network.weights))
    seen = {}

    def custom(*args, **kwargs):  # takes any keyword, as a custom op may
        seen.update(kwargs)
        return references()["rms_norm_linear"](*args, eps=kwargs["eps"])

    session = Session(network, "cpu", ops=dict(references(), rms_norm_linear=custom))
    assert payload not in session.source and "system" not in session.source and "open" not in session.source
    assert not marker.exists()
    runner = ModelRunner(engine, torch.device("cpu"))
    runner.session = session
    runner.executor.runner.session = session
    runner.generate([[1, 2, 3]], max_new_tokens=1)
    assert seen[payload] == payload  # passed as data, never as code
    assert not marker.exists()


def test_an_unknown_attribute_that_is_a_plain_name_is_refused_too(engine_dir):
    """Not only code: any key the op does not take (here one torch would accept) is refused."""
    def edit(graph, weights):
        first_layer(graph, "add")["attrs"]["alpha"] = 2
    craft(engine_dir, edit)
    with pytest.raises(EngineError, match=r"layer '.*add.*' has attribute 'alpha', which op add does not take "
                                          r"\(it takes: none\)"):
        Engine.from_dir(engine_dir)


def test_structural_lies_are_refused(engine_dir):
    def read_later(graph, weights):  # reads a tensor that only a later layer makes
        layers = [layer for layer in graph["layers"] if layer["op"] != "constant"]
        layers[0]["inputs"][0] = layers[3]["outputs"][0]
    craft(engine_dir, read_later)
    with pytest.raises(EngineError, match="which no input or earlier layer defines"):
        Engine.from_dir(engine_dir)


def test_a_missing_attribute_and_a_wrong_input_count_are_refused(engine_dir, tmp_path):
    def drop(graph, weights):
        del first_layer(graph, "gpt_attention")["attrs"]["layer_idx"]
    craft(engine_dir, drop)
    with pytest.raises(EngineError, match=r"\(gpt_attention\) lacks attribute\(s\) layer_idx"):
        Engine.from_dir(engine_dir)


def test_a_norm_eps_no_kernel_takes_is_refused_at_load(engine_dir):
    """A negative eps (found by tests/fuzz) once passed the load and reached the host RMSNorm
    kernel's own check at the first step: now the replay of the ops refuses it."""
    def negative_eps(graph, weights):
        next(layer for layer in graph["layers"] if "eps" in layer["attrs"])["attrs"]["eps"] = -1.0
    craft(engine_dir, negative_eps)
    with pytest.raises(EngineError, match=r"does not hold together: \w+: eps must be finite and >= 0, got -1.0"):
        Engine.from_dir(engine_dir)


def test_op_attributes_are_derived_from_the_op_references():
    sigs = op_signatures()
    assert set(sigs) == set(references()) | {"constant"}
    assert sigs["rms_norm"].attrs == {"eps"} and sigs["add"].attrs == frozenset()
    assert sigs["add"].min_inputs == sigs["add"].max_inputs == 2
    assert "layer_idx" in sigs["gpt_attention"].required_attrs
    assert sigs["concat"].max_inputs is None


def test_every_name_the_builder_makes_fits_the_grammar(built):
    graph = Engine.from_dir(built).network.to_dict()
    check_graph(graph, "built")  # also run by from_dir; here on its own
    names = [layer["name"] for layer in graph["layers"]] + list(graph["tensors"]) + list(graph["weights"])
    assert all(re.fullmatch(NAME_PATTERN, n) for n in names)


# ---- config.json beside the engine and the engine's own copy --------------------------------


@pytest.mark.parametrize("field, path, value", [
    ("num_key_value_heads", ("pretrained_config", "num_key_value_heads"), 4),
    ("vocab_size", ("pretrained_config", "vocab_size"), 100000),
    ("max_seq_len", ("build_config", "max_seq_len"), 512),
    ("max_batch_size", ("build_config", "max_batch_size"), 64),
])
def test_edited_config_json_is_refused_naming_the_field(engine_dir, field, path, value):
    def edit(config):
        config[path[0]][path[1]] = value
    edit_config_json(engine_dir, edit)
    with pytest.raises(EngineError) as e:
        ModelRunner.from_dir(engine_dir, device="cpu")
    assert f"disagrees with rank0.engine on {'.'.join(path)}:" in str(e.value)
    assert "config.json was edited" in str(e.value)


def test_edited_world_size_is_refused(engine_dir):
    def edit(config):
        config["pretrained_config"]["mapping"]["world_size"] = 2
    edit_config_json(engine_dir, edit)
    with pytest.raises(EngineError, match=r"pretrained_config is malformed \(.*world_size \(2\) must equal"):
        ModelRunner.from_dir(engine_dir, device="cpu")

    def edit_both(config):
        config["pretrained_config"]["mapping"]["tp_size"] = 2
    edit_config_json(engine_dir, edit_both)
    with pytest.raises(EngineError,
                       match=r"on pretrained_config.mapping.tp_size, pretrained_config.mapping.world_size"):
        ModelRunner.from_dir(engine_dir, device="cpu")


@pytest.mark.parametrize("text, refusal", [
    ("[1, 2, 3]", "is a JSON list, not an object"),
    ("not json {", "is not valid JSON"),
    ('"a string"', "is a JSON str, not an object"),
    ('{"version": [], "pretrained_config": {}}', "has no version object"),
])
def test_malformed_config_json_is_refused(engine_dir, text, refusal):
    (engine_dir / "config.json").write_text(text)
    with pytest.raises(EngineError, match=re.escape(refusal)):
        Engine.from_dir(engine_dir)


def test_wrong_types_in_config_json_are_refused(engine_dir):
    def edit(config):
        config["build_config"]["max_batch_size"] = "4"
    edit_config_json(engine_dir, edit)
    with pytest.raises(EngineError, match=r"build_config.max_batch_size is '4', not of type int"):
        Engine.from_dir(engine_dir)

    def edit2(config):
        config["build_config"]["max_batch_size"] = 4
        config["pretrained_config"] = [1]
    edit_config_json(engine_dir, edit2)
    with pytest.raises(EngineError, match=r"pretrained_config is list, not an object"):
        Engine.from_dir(engine_dir)


@pytest.mark.parametrize("path, value, refusal", [
    (("pretrained_config", "vocab_size"), 100000, "the token embedding has 320 rows, vocab_size is 100000"),
    (("build_config", "max_seq_len"), 400, "the rotary table has 128 positions, max_seq_len is 400"),
    (("pretrained_config", "num_key_value_heads"), 4, "input kv_cache_pool is float32 [2, -1, 2, 2, 8, 16], "
                                                      "the config implies float32 [2, -1, 2, 4, 8, 16]"),
    (("pretrained_config", "num_hidden_layers"), 1, "input kv_cache_pool is float32 [2, -1, 2, 2, 8, 16]"),
])
def test_a_config_lie_told_in_both_copies_is_caught_by_the_graph(engine_dir, path, value, refusal):
    """An attacker edits config.json and the rank file's copy alike (and the checksum): the
    graph's own shapes still give the lie away before a kernel indexes with it."""
    def edit(config):
        config[path[0]][path[1]] = value
    craft(engine_dir, edit_config=edit)
    edit_config_json(engine_dir, edit)
    with pytest.raises(EngineError, match="the engine's config disagrees with its graph") as e:
        ModelRunner.from_dir(engine_dir, device="cpu")
    assert refusal in str(e.value)


def test_an_engine_of_the_previous_format_is_refused(engine_dir):
    path = engine_dir / "rank0.engine"
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
        weights = {k: f.get_tensor(k) for k in f.keys()}
    meta["format_version"] = "1"
    save_file(weights, str(path), metadata=meta)
    with pytest.raises(EngineError, match="format version 1, this runtime reads version 2; rebuild"):
        Engine.from_dir(engine_dir)


def test_untouched_engine_loads_and_generates(built):
    out = ModelRunner.from_dir(built, device="cpu").generate([[1, 2, 3]], max_new_tokens=3)
    assert out["output_ids"].shape == (1, 1, 6)


# ---- trtllm-build: a KV cache that cannot fit ------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(hf, tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    config = config_from_hf(hf.config, dtype="float32")
    save_checkpoint(path, config, [load_weights_from_hf(hf, config)])
    return path


def build_args(checkpoint, out, batch, target):
    return ["--checkpoint_dir", str(checkpoint), "--output_dir", str(out), "--max_batch_size", str(batch),
            "--max_input_len", "64", "--max_seq_len", "512", "--target_device", target, "--no_rewrite"]


def test_build_refuses_a_kv_cache_larger_than_the_target_gpu(checkpoint, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(build_cmd, "target_memory_bytes", lambda target: 16 * 2**30)
    argv = build_args(checkpoint, tmp_path / "e", 100000, "cuda:sm_90")
    with pytest.raises(ConfigError) as e:
        build_cmd.main(argv)
    # 100000 sequences x 512 tokens x 2 layers x 2 (K, V) x 2 KV heads x 16 dims x 4 bytes
    assert str(e.value).startswith("the KV cache these limits imply (24.4 GiB: max_batch_size 100000 x "
                                   "max_beam_width 1 sequences of max_seq_len 512 tokens, x 2 layers x 2 x "
                                   "2 KV heads x 16 x 4 bytes) does not fit the 16.0 GiB of cuda:sm_90")
    assert run_cli(build_cmd.main, "trtllm-build", argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("trtllm-build: error: the KV cache these limits imply (24.4 GiB") and err.count("\n") == 1
    assert "lower --max_batch_size, --max_seq_len or --max_beam_width" in err
    assert not (tmp_path / "e").exists()


def test_build_warns_when_the_kv_cache_exceeds_the_host_memory(checkpoint, tmp_path, monkeypatch, capsys):
    # 1000 sequences x 512 tokens x 512 bytes = 250 MiB
    monkeypatch.setattr(build_cmd, "host_memory_bytes", lambda: 2**30)
    assert build_cmd.main(build_args(checkpoint, tmp_path / "e", 1000, "any")) == 0
    assert "warning" not in capsys.readouterr().err
    monkeypatch.setattr(build_cmd, "host_memory_bytes", lambda: 2**27)
    assert build_cmd.main(build_args(checkpoint, tmp_path / "e", 1000, "any")) == 0
    err = capsys.readouterr().err
    assert "warning: the KV cache these limits imply (250.0 MiB: max_batch_size 1000" in err
    assert "exceeds this host's 128.0 MiB of memory" in err and err.count("\n") == 1


def test_kv_cache_bytes_are_the_runtimes(hf, built):
    """The build's estimate is the pool ModelRunner allocates on the CPU (less its scratch block)."""
    from tensorrt_llm.kv_cache_layout import KVCacheLayout
    engine = Engine.from_dir(built)
    bc = engine.build_config
    runner = ModelRunner(engine, torch.device("cpu"))
    layout = KVCacheLayout.of_engine(engine.pretrained_config, bc.tokens_per_block)
    pool = runner.kv_cache_pool
    per_block = pool[:, :1].numel() * pool.element_size()
    assert per_block == layout.bytes_per_block
    assert layout.max_pool_bytes(bc.max_batch_size * bc.max_beam_width, bc.max_seq_len) == \
        (pool.shape[1] - 1) * per_block


@pytest.mark.parametrize("bad", [-1, "in_features"])
def test_an_act_order_permutation_out_of_range_is_refused_at_load(hf, tmp_path, bad):
    """An INT4 act-order linear gathers its input by its weight_perm, a weight the file holds: an
    index past the input (a CUDA gather would read past it, or fault the process) is refused."""
    from tensorrt_llm.builder import BuildConfig, build
    from tensorrt_llm.models.llama.convert import load_weight_only_from_awq_gptq
    from tensorrt_llm.models.llama.model import LLaMAForCausalLM

    from ..models.test_awq_gptq_convert import _folder
    folder, _ = _folder(hf, tmp_path / "gptq", "gptq", act_order=True)
    config, weights = load_weight_only_from_awq_gptq(folder, config_from_hf(folder, "float32"))
    model = LLaMAForCausalLM(config)
    model.load(weights)
    engine_dir = tmp_path / "engine"
    build(model, BuildConfig(max_batch_size=2, max_input_len=32, max_seq_len=48, tokens_per_block=8,
                             target_device="any")).save(engine_dir)
    Engine.from_dir(engine_dir)  # as built, it loads
    name = "transformer.layers.1.attention.dense.weight_perm"

    def out_of_range(graph, weights):
        perm = weights[name].clone()
        perm[3] = perm.numel() if bad == "in_features" else bad
        weights[name] = perm
    craft(engine_dir, out_of_range)
    k = config.hidden_size
    span = "-1 .. " + str(k - 1) if bad == -1 else f"0 .. {k}"
    with pytest.raises(EngineError, match=rf"\(weight_only_linear\): its index '{re.escape(name)}' holds indices "
                                          rf"{re.escape(span)} into a dimension of size {k}; do not use"):
        Engine.from_dir(engine_dir)


def test_an_act_order_permutation_the_graph_computes_is_refused():
    """The GEMV gathers x by perm without checking each value: only a weight, checked at load, may
    be one; a perm made by the graph (here an input) is refused."""
    from tensorrt_llm import functional as F
    from tensorrt_llm.engine_check import check_constant_indices
    from tensorrt_llm.network import net_guard
    from tensorrt_llm.quantization import quantize_int4
    net = Network("crafted")
    with net_guard(net):
        x = net.add_input("x", "bfloat16", [1, 64])
        perm = net.add_input("perm", "int64", [64])
        w = quantize_int4(torch.randn(32, 64), 32)
        net.mark_output(F.weight_only_linear(x, F.constant(w.qweight, name="w"), F.constant(w.scales, name="s"),
                                             F.constant(w.zeros, name="z"), None, perm, weight_format="int4",
                                             group_size=32), "y")
    with pytest.raises(EngineError, match=r"\(weight_only_linear\): its perm is not a weight of the engine"):
        check_constant_indices(net, "crafted")
