"""Model definitions, their configs and checkpoint converters."""
from .modeling_utils import (KNOWN_ARCHITECTURES, PretrainedConfig, load_checkpoint_weights,
                             save_checkpoint)
from .decoder import DecoderModelForCausalLM, PretrainedModel
from .llama.model import LLaMAForCausalLM

# Checkpoint `architecture` name -> model class; trtllm-build looks models up here.
MODEL_MAP = {
    "LlamaForCausalLM": LLaMAForCausalLM,
}
KNOWN_ARCHITECTURES.update(MODEL_MAP)
