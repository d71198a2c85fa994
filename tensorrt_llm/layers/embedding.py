from .. import functional as F
from ..module import Module
from ..parameter import Parameter


class Embedding(Module):

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: str = "float32"):
        super().__init__()
        self.weight = Parameter(shape=(num_embeddings, embedding_dim), dtype=dtype)

    def forward(self, input_ids):
        return F.embedding(input_ids, self.weight.tensor)
