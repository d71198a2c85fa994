from .. import functional as F
from ..module import Module
from ..parameter import Parameter


class Embedding(Module):
    """A lookup table. With tp_size > 1 it is vocabulary-parallel: this rank holds rows
    [tp_rank * n, (tp_rank + 1) * n) of the table padded to a multiple of tp_size
    (n = padded rows / tp_size), looks up the ids among them (zeros for the others) and the
    ranks' lookups are summed with an allreduce."""

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: str = "float32",
                 tp_size: int = 1, tp_rank: int = 0):
        super().__init__()
        self.tp_size, self.tp_rank = tp_size, tp_rank
        rows = -(-num_embeddings // tp_size)
        self.weight = Parameter(shape=(rows, embedding_dim), dtype=dtype)

    def forward(self, input_ids):
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight.tensor)
        rows = self.weight.shape[0]
        return F.allreduce(F.embedding(input_ids, self.weight.tensor, vocab_start=self.tp_rank * rows))
