"""LLaMA engines with a quantized KV cache (issue #17, `kv_cache_quant_algo` FP8 / INT8): the
calibrated K/V maxima, the checkpoint's `kv_cache_scale` tensors, the engine's 1-byte pool (half
the bytes per block), generation on the CPU close to the float engine, the refusal of FP8 KV on
GPUs before sm_89, and save/load/refit carrying the scales."""
import dataclasses

import pytest
import torch

from tensorrt_llm.builder import BuildConfig, build, check_quantization_target
from tensorrt_llm.engine import Engine
from tensorrt_llm.errors import ConfigError
from tensorrt_llm.kv_cache_layout import KVCacheLayout
from tensorrt_llm.models.calibrate import calibrate
from tensorrt_llm.models.llama.convert import config_from_hf, load_weights_from_hf
from tensorrt_llm.models.llama.model import LLaMAForCausalLM
from tensorrt_llm.models.modeling_utils import save_checkpoint
from tensorrt_llm.models.quantize import fp8_config, kv_cache_config, quantize_checkpoint, weight_only_config
from tensorrt_llm.refit import refit_engine

from .llama_utils import random_hf_llama, runner

BC = dict(max_batch_size=2, max_input_len=64, max_seq_len=128, tokens_per_block=8, target_device="any")
PROMPTS = [list(range(3, 40)), list(range(100, 160, 2))]
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def hf():
    return random_hf_llama(seed=11, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="module")
def float_weights(hf):
    config = config_from_hf(hf.config, dtype="float32")
    return config, load_weights_from_hf(hf, config)


@pytest.fixture(scope="module")
def calibration(hf):
    return calibrate(hf, PROMPTS, kv_cache=True)


def _engine(config, weights, path):
    model = LLaMAForCausalLM(config)
    model.load(weights)
    build(model, BuildConfig(**BC)).save(path)
    return path


def _generate(engine_dir):
    out = runner(engine_dir).generate(PROMPTS, max_new_tokens=NEW_TOKENS, return_context_logits=True)
    return out


def test_calibration_takes_rotated_k_and_v_maxima(hf, calibration):
    amax = calibration.kv_cache_amax
    assert set(amax) == {"transformer.layers.0.attention", "transformer.layers.1.attention"}
    # K's maximum bounds every rotated K element: take layer 0's k_proj output and rotate it at
    # many angles by hand.
    k_out = []
    hook = hf.model.layers[0].self_attn.k_proj.register_forward_hook(lambda m, i, o: k_out.append(o))
    with torch.no_grad():
        hf(input_ids=torch.tensor([PROMPTS[0]]))
    hook.remove()
    k = k_out[0].reshape(-1, 16)
    x1, x2 = k[:, :8], k[:, 8:]
    angles = torch.linspace(0, 6.3, 64).view(-1, 1, 1)
    rotated = (x1 * torch.cos(angles) - x2 * torch.sin(angles)).abs().amax()
    k_max = float(amax["transformer.layers.0.attention"][0])
    assert float(rotated) <= k_max * (1 + 1e-6) and float(rotated) >= 0.9 * k_max
    assert all(a.shape == (2,) and a.dtype == torch.float32 and bool((a > 0).all()) for a in amax.values())
    assert calibration.input_amax  # the same pass calibrates the FP8 activation scales


@pytest.mark.parametrize("kv", ["fp8", "int8"])
def test_checkpoint_scales_and_pool(float_weights, calibration, kv):
    config, weights = float_weights
    config = kv_cache_config(config, kv)
    assert config.quant_config.kv_cache_quant_algo.value == kv.upper()
    assert config.kv_cache_dtype == {"fp8": "uint8", "int8": "int8"}[kv]
    out = quantize_checkpoint(LLaMAForCausalLM, config, weights, kv_cache_amax=calibration.kv_cache_amax)
    top = {"fp8": 448.0, "int8": 127.0}[kv]
    for layer in range(2):
        name = f"transformer.layers.{layer}.attention"
        scale = out[f"{name}.kv_cache_scale"]
        assert scale.dtype == torch.float32 and torch.equal(scale, calibration.kv_cache_amax[name] / top)
    layout = KVCacheLayout.of_engine(config.to_dict(), 8)
    float_layout = KVCacheLayout.of_engine(float_weights[0].to_dict(), 8)
    assert layout.bytes_per_block * 4 == float_layout.bytes_per_block  # float32 -> 1 byte


def test_fp8_without_calibration_is_scale_one_and_int8_needs_it(float_weights):
    config, weights = float_weights
    out = quantize_checkpoint(LLaMAForCausalLM, kv_cache_config(config, "fp8"), weights)
    assert torch.equal(out["transformer.layers.1.attention.kv_cache_scale"], torch.ones(2))
    with pytest.raises(ValueError, match="INT8 KV cache needs calibrated"):
        quantize_checkpoint(LLaMAForCausalLM, kv_cache_config(config, "int8"), weights)


@pytest.fixture(scope="module")
def float_run(float_weights, tmp_path_factory):
    config, weights = float_weights
    return _generate(_engine(config, weights, tmp_path_factory.mktemp("float")))


# Tolerance, as the root-mean-square error of the context logits over their standard deviation:
# the cache rounds K and V to 3 mantissa bits (FP8, relative error up to 2^-4) or to steps of
# amax / 127 (INT8), and this random model (weights of std 0.15, chosen so that logits are
# discriminative) amplifies a perturbation through its two layers: measured 0.07 (FP8) and 0.03
# (INT8), 0.17 and 0.04 with FP8 / INT8 weights too; the bounds leave about 1.5x. Greedy decoding
# of near-tied random logits may part later, so the first new token is compared.
@pytest.mark.parametrize("kv,weights_as,tolerance", [
    ("fp8", None, 0.11), ("int8", None, 0.045), ("fp8", "fp8", 0.28), ("int8", "int8", 0.065)])
def test_engine_generates_close_to_float(float_weights, calibration, float_run, tmp_path, kv, weights_as,
                                         tolerance):
    config, weights = float_weights
    if weights_as == "fp8":
        config = fp8_config(config)
    elif weights_as == "int8":
        config = weight_only_config(config, "int8")
    config = kv_cache_config(config, kv)
    quantized = quantize_checkpoint(LLaMAForCausalLM, config, weights, input_amax=calibration.input_amax,
                                    kv_cache_amax=calibration.kv_cache_amax)
    engine_dir = _engine(config, quantized, tmp_path / "engine")
    engine = Engine.from_dir(engine_dir)
    assert engine.network._tensors["kv_cache_pool"].dtype == config.kv_cache_dtype
    assert "transformer.layers.0.attention.kv_cache_scale" in engine.network.weights
    out = _generate(engine_dir)
    for b, prompt in enumerate(PROMPTS):
        ref, got = float_run["context_logits"][b], out["context_logits"][b]
        assert float((got - ref).pow(2).mean().sqrt() / ref.std()) <= tolerance
        first_new = len(prompt)
        assert out["output_ids"][b, 0, first_new] == float_run["output_ids"][b, 0, first_new]


def test_scales_are_weights_that_save_load_and_refit(float_weights, calibration, tmp_path):
    config, weights = float_weights
    config = kv_cache_config(config, "int8")
    quantized = quantize_checkpoint(LLaMAForCausalLM, config, weights, kv_cache_amax=calibration.kv_cache_amax)
    engine_dir = _engine(config, quantized, tmp_path / "engine")
    name = "transformer.layers.1.attention.kv_cache_scale"
    assert torch.equal(Engine.from_dir(engine_dir).network.weights[name], quantized[name])
    save_checkpoint(tmp_path / "ckpt", config, [dict(quantized, **{name: quantized[name] * 2})])
    refit_engine(engine_dir, tmp_path / "ckpt", tmp_path / "refit")
    assert torch.equal(Engine.from_dir(tmp_path / "refit").network.weights[name], quantized[name] * 2)


def test_builder_refuses_fp8_kv_before_sm89(float_weights):
    config = kv_cache_config(float_weights[0], "fp8")
    with pytest.raises(ConfigError, match="FP8 KV cache needs a GPU of compute capability 8.9.*sm_80"):
        check_quantization_target(config.quant_config, "cuda:sm_80")
    check_quantization_target(config.quant_config, "cuda:sm_90")
    check_quantization_target(kv_cache_config(float_weights[0], "int8").quant_config, "cuda:sm_80")
    model = LLaMAForCausalLM(config)
    with pytest.raises(ConfigError, match="FP8 KV cache"):
        build(model, BuildConfig(**dict(BC, target_device="cuda:sm_80")))


def test_config_refuses_kv_quant_for_unquantizable_architectures(float_weights):
    config = dataclasses.replace(float_weights[0], architecture="GPTForCausalLM")
    with pytest.raises((ConfigError, ValueError)):
        kv_cache_config(config, "fp8").validate()


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["fp8", "int8"])
def test_engine_on_cuda_matches_the_cpu_reference(tmp_path, kv):
    # head size 64: the GPU runs the paged write, the decode kernel (in CUDA graphs) and the
    # varlen path over codes; the CPU runs the reference of the same engine. Both read the same
    # codes, so they differ only by the GPU's float16 rounding (MMA operands, probabilities).
    if kv == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 KV cache needs sm_89 or newer")
    hf = random_hf_llama(seed=3, hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
    config = config_from_hf(hf.config, dtype="float16")
    weights = load_weights_from_hf(hf, config)
    config = kv_cache_config(config, kv)
    amax = calibrate(hf, PROMPTS, kv_cache=True).kv_cache_amax
    engine_dir = _engine(config, quantize_checkpoint(LLaMAForCausalLM, config, weights, kv_cache_amax=amax),
                         tmp_path / "engine")
    outs = {device: runner(engine_dir, device=device).generate(PROMPTS, max_new_tokens=NEW_TOKENS,
                                                               return_context_logits=True)
            for device in ("cpu", "cuda")}
    for b, prompt in enumerate(PROMPTS):
        ref, got = outs["cpu"]["context_logits"][b].float(), outs["cuda"]["context_logits"][b].float().cpu()
        assert float((got - ref).pow(2).mean().sqrt() / ref.std()) <= 0.02
        first_new = len(prompt)
        assert outs["cuda"]["output_ids"][b, 0, first_new] == outs["cpu"]["output_ids"][b, 0, first_new]
