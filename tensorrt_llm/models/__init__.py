"""Model definitions, their configs and checkpoint converters."""
from .decoder import DecoderModelForCausalLM, PretrainedModel
from .gpt.model import GPTForCausalLM
from .llama.model import LLaMAForCausalLM
from .modeling_utils import (
    KNOWN_ARCHITECTURES,
    QUANTIZABLE_ARCHITECTURES,
    PretrainedConfig,
    load_checkpoint_weights,
    save_checkpoint,
)

# Checkpoint `architecture` name -> model class; trtllm-build looks models up here.
MODEL_MAP = {
    "LlamaForCausalLM": LLaMAForCausalLM,
    # The GPT family: one decoder, the variant set by the config (gpt/model.py).
    "GPTForCausalLM": GPTForCausalLM,
    "OPTForCausalLM": GPTForCausalLM,
    "PhiForCausalLM": GPTForCausalLM,
    "BloomForCausalLM": GPTForCausalLM,
}
KNOWN_ARCHITECTURES.update(MODEL_MAP)
# The models whose linears take weight-only INT8 / INT4 weights (llama/model.py quantize_linears).
QUANTIZABLE_ARCHITECTURES.update(name for name, cls in MODEL_MAP.items() if issubclass(cls, LLaMAForCausalLM))

__all__ = ["KNOWN_ARCHITECTURES", "MODEL_MAP", "PretrainedConfig", "PretrainedModel", "DecoderModelForCausalLM",
           "load_checkpoint_weights", "save_checkpoint", "GPTForCausalLM", "LLaMAForCausalLM"]
