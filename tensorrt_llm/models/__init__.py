"""Model definitions, their configs and checkpoint converters."""
from .modeling_utils import (KNOWN_ARCHITECTURES, PretrainedConfig, load_checkpoint_weights,
                             save_checkpoint)
