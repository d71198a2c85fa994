"""PretrainedModel and the decoder-only causal LM every model of the zoo specialises.

A model defines its network when called under `net_guard`: `prepare_inputs` adds the
runtime inputs (docs/architecture.md, "Runtime inputs of an LLM engine") and `forward`
adds the layers and marks `logits` as the output.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .. import functional as F
from ..layers import AttentionInputs, alibi_slopes
from ..module import Module
from ..network import Tensor, default_net
from .modeling_utils import PretrainedConfig, cast_weights, load_checkpoint_weights


class PretrainedModel(Module):

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.config = config

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> "PretrainedModel":
        return cls(config)

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: str | Path, rank: int = 0,
                        dtype: Optional[str] = None) -> "PretrainedModel":
        """The model of one rank with its weights bound; `dtype` casts them."""
        config = PretrainedConfig.from_checkpoint(checkpoint_dir, rank=rank)
        weights = load_checkpoint_weights(checkpoint_dir, rank)
        if dtype is not None and dtype != config.dtype:
            config.dtype = dtype
            weights = cast_weights(weights, dtype)
        model = cls(config)
        model.load(weights)
        return model


class DecoderModelForCausalLM(PretrainedModel):
    """transformer (embedding, decoder layers, ln_f) + lm_head over packed tokens."""

    def prepare_inputs(self, max_batch_size: int, max_beam_width: int, max_seq_len: int, max_num_tokens: int,
                       tokens_per_block: int) -> dict[str, Tensor]:
        """The runtime inputs, their dynamic dims ranging up to the build's limits."""
        cfg = self.config
        net = default_net()
        tokens = ("num_tokens", (1, min(max_num_tokens, 256), max_num_tokens))
        # The rows whose logits are asked for: one per request, or every token (context logits).
        logit_rows = ("num_logits", tokens[1])
        # Beam search runs every beam of every request as a row of the batch.
        rows = max_batch_size * max_beam_width
        batch = ("batch_size", (1, rows // 2 + 1, rows))
        max_blocks = -(-max_seq_len // tokens_per_block)
        # KV heads replicated (one per rank) when tp_size exceeds them; this stage's layers only.
        kv_heads = max(1, cfg.num_key_value_heads // cfg.mapping.tp_size)
        num_layers = len(cfg.mapping.pp_layers(cfg.num_hidden_layers))
        inputs = {
            "input_ids": net.add_input("input_ids", "int32", [-1], {0: tokens}),
            "position_ids": net.add_input("position_ids", "int32", [-1], {0: tokens}),
            "last_token_ids": net.add_input("last_token_ids", "int64", [-1], {0: logit_rows}),
            "kv_cache_pool": net.add_input(
                "kv_cache_pool", cfg.kv_cache_dtype,
                [num_layers, -1, 2, kv_heads, tokens_per_block, cfg.head_size],
                {1: ("num_blocks", (1, max_batch_size * max_blocks, max_batch_size * max_blocks * 64))}),
            "block_tables": net.add_input("block_tables", "int32", [-1, -1],
                                          {0: batch, 1: ("max_blocks_per_seq", (1, max_blocks, max_blocks))}),
            "sequence_lengths": net.add_input("sequence_lengths", "int32", [-1], {0: batch}),
            "context_lengths": net.add_input("context_lengths", "int32", [-1], {0: batch}),
            "host_context_lengths": net.add_input("host_context_lengths", "int32", [-1], {0: batch}),
            "host_sequence_lengths": net.add_input("host_sequence_lengths", "int32", [-1], {0: batch}),
        }
        self._max_positions = max_seq_len
        return inputs

    def rotary_table(self) -> Optional[Tensor]:
        cfg = self.config
        if not cfg.position_embedding_type.startswith("rope"):
            return None
        table = F.rope_cos_sin_cache(self._max_positions, cfg.rotary_dim, cfg.rotary_base,
                                     cfg.rotary_scaling)
        return F.constant(table, name="rotary_cos_sin")

    def alibi_table(self) -> Optional[Tensor]:
        """The ALiBi slopes of this rank's heads, float32 [num_heads / tp]."""
        cfg = self.config
        if cfg.position_embedding_type != "alibi":
            return None
        heads = cfg.num_attention_heads // cfg.mapping.tp_size
        first = cfg.mapping.tp_rank * heads
        return F.constant(alibi_slopes(cfg.num_attention_heads)[first:first + heads], name="alibi_slopes")

    def forward(self, input_ids, position_ids, last_token_ids, kv_cache_pool, block_tables,
                sequence_lengths, context_lengths, host_context_lengths, host_sequence_lengths) -> Tensor:
        """The network of this rank. Tensor parallelism: each rank computes its heads and MLP
        columns (RowLinear's allreduce sums them) and its slice of the vocabulary's logits,
        gathered into the whole row. Pipeline parallelism: a stage after the first receives
        the hidden states from the previous one; a stage before the last ends at sending its
        output to the next (its network's output `hidden_states` is what it sent), and the
        last stage's `logits` reach the earlier stages outside the graph (runtime/pipeline.py),
        so no stage's step waits for a later stage."""
        cfg = self.config
        m = cfg.mapping
        attn = AttentionInputs(position_ids, kv_cache_pool, block_tables, sequence_lengths,
                               context_lengths, host_context_lengths, host_sequence_lengths,
                               rotary_cos_sin=self.rotary_table(), alibi_slopes=self.alibi_table())
        if m.pp_size == 1:
            hidden = self.transformer(input_ids, attn)
        else:
            received = None if m.is_first_pp_rank() else F.recv(
                input_ids, peer=m.prev_pp_rank(), dtype=cfg.dtype, tail=[cfg.hidden_size])
            hidden = self.transformer(input_ids, attn, received)
        if not m.is_last_pp_rank():
            sent = F.send(hidden, peer=m.next_pp_rank())
            default_net().mark_output(sent, "hidden_states")
            return sent
        # Only the rows whose logits are asked for go through ln_f and lm_head: last_token_ids is
        # strictly increasing (docs/architecture.md), so a decode step's, one a row, copies nothing.
        hidden = F.index_select(hidden, 0, last_token_ids, increasing=True)
        if self.transformer.ln_f is not None:  # None: post-norm layers end normed
            hidden = self.transformer.ln_f(hidden)
        if self.config.share_embedding_table:
            logits = F.linear(hidden, self.transformer.vocab_embedding.weight.tensor)
        else:
            logits = self.lm_head(hidden)
        if m.tp_size > 1:
            # Each rank holds vocab_size_padded / tp rows of the head: gather the slices and
            # drop the padding rows' logits.
            logits = F.allgather(logits, dim=-1, group_size=m.tp_size)
            if cfg.vocab_size_padded != cfg.vocab_size:
                logits = F.slice(logits, -1, 0, cfg.vocab_size)
        if logits.dtype != self.config.logits_dtype:
            logits = F.cast(logits, self.config.logits_dtype)
        default_net().mark_output(logits, "logits")
        return logits
