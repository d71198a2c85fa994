"""Building blocks of decoder models, written with the functional ops."""
from .attention import Attention, AttentionInputs, alibi_slopes
from .embedding import Embedding
from .linear import ColumnLinear, Linear, RowLinear
from .mlp import MLP, GatedMLP
from .normalization import LayerNorm, RmsNorm

__all__ = ["Attention", "AttentionInputs", "alibi_slopes", "Embedding", "ColumnLinear", "Linear", "RowLinear",
           "MLP", "GatedMLP", "LayerNorm", "RmsNorm"]
