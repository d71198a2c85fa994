"""Beam search on the paged KV cache, with the semantics of transformers' `_beam_search`.

Scoring, per request and step (transformers' generation/utils.py):
  - log_softmax of the logits in float32, then the logits processors (penalties,
    min_length, bad words) on those log-probabilities; add each beam's running score;
  - keep the 2 * num_beams best (beam, token) candidates over all beams;
  - a candidate among the first num_beams that ends (end_id, a stop word, or the last
    step) becomes a finished hypothesis scored sum / generated_tokens ** length_penalty,
    kept if it is among the num_beams best finished ones; the num_beams best candidates
    that did not end are the next running beams;
  - a request is done when no running beam can beat its worst finished hypothesis
    (early_stopping False / "never": judged at the current / the longest length), when
    early_stopping is True and num_beams hypotheses finished, or at max_new_tokens.

The cache: every beam is a sequence of the KV cache manager. The prompts run once; each
prompt's sequence is then forked into its beams (blocks shared, refcounted). After every
step the next beams are formed by forking the sequences they continue and freeing the old
ones, so a beam shares all the blocks of its parent; before it writes its next token it
copies only its parent's partially filled last block, when that is shared (copy on write).
No step copies a whole cache. Beam search runs without CUDA graphs: its batch is
re-formed at every step.
"""
from __future__ import annotations

import itertools

import torch

from .kv_cache_manager import KVCacheFullError, copy_blocks
from .sampling import SamplingConfig, process_logits

# transformers' score of an impossible candidate.
_NEG = -1.0e9


def generate(gs, batch_input_ids: list[torch.Tensor], sampling: SamplingConfig,
             max_new_tokens: int, return_context_logits: bool, stop, bad, outputs: dict):
    """GenerationSession.generate for num_beams > 1: yields the running beams after every
    step, then the result (see `_Search.result`)."""
    kv = gs.kv_cache
    K = sampling.num_beams
    # Beams grow block by block; check now that the worst case (no block shared) fits, so
    # that a request does not fail half-way.
    needed = sum(K * kv.blocks_needed(ids.numel() + max_new_tokens) for ids in batch_input_ids)
    if needed > kv.num_free_blocks:
        raise KVCacheFullError("beam search", needed, kv.num_free_blocks, kv.num_blocks)
    search = _Search(gs, batch_input_ids, sampling, max_new_tokens, stop, bad)
    try:
        yield from search.run(return_context_logits, outputs)
    finally:
        for ids in search.seq_ids:
            for s in set(ids):
                kv.free_sequence(s)


class _Search:

    def __init__(self, gs, batch_input_ids, sampling, max_new_tokens, stop, bad):
        self.gs, self.kv, self.dev = gs, gs.kv_cache, gs.device
        self.sampling, self.stop, self.bad = sampling, stop, bad
        self.K, self.G = sampling.num_beams, max_new_tokens
        B = len(batch_input_ids)
        self.prompt_lens = torch.tensor([ids.numel() for ids in batch_input_ids])
        self.W = int(self.prompt_lens.max()) + max_new_tokens
        self.ids = itertools.count()
        self.seq_ids: list[list] = []  # per active request: the KV sequence of each beam
        prompts = torch.full((B, self.W), sampling.pad_id, dtype=torch.int64)
        for b, ids in enumerate(batch_input_ids):
            prompts[b, :ids.numel()] = ids
        # The result of every request, filled in when it is done (host).
        self.out_ids = prompts[:, None].repeat(1, self.K, 1)
        self.out_lens = self.prompt_lens[:, None].repeat(1, self.K)
        self.out_scores = torch.zeros(B, self.K)
        self.out_cum = torch.zeros(B, self.K)
        self.out_log_probs = torch.zeros(B, self.K, self.G)
        self.prompts = prompts

    def run(self, return_context_logits: bool, outputs: dict):
        dev, K, G, kv = self.dev, self.K, self.G, self.kv
        B = len(self.prompt_lens)
        for b in range(B):
            kv.add_sequence(("prompt", b), int(self.prompt_lens[b]))
            self.seq_ids.append([("prompt", b)] * K)
        prompts = [self.prompts[b, :int(n)].tolist() for b, n in enumerate(self.prompt_lens)]
        logits, context_logits = self.gs.runner.context([("prompt", b) for b in range(B)], prompts,
                                                        return_context_logits)
        # Every beam of a request starts as its prompt; only the first may be extended, so
        # that the first step picks distinct tokens (transformers' initial scores).
        logits = logits.repeat_interleave(K, dim=0)
        s = _State(self.prompts.to(dev)[:, None].repeat(1, K, 1), self.prompt_lens.to(dev), K, G)
        active = torch.arange(B)  # requests still searching, in the order of the state's rows

        for step in range(G):
            src, tokens, done = self._step(s, logits, step, active)
            finished = done.nonzero().squeeze(1).tolist()
            for i in finished:
                self._record(s, i, int(active[i]))
            yield self._partial(s, active, done, step)
            if len(finished) == active.numel():
                break
            keep = (~done).nonzero().squeeze(1)
            for i in reversed(finished):
                for sid in set(self.seq_ids.pop(i)):
                    kv.free_sequence(sid)
            active = active[keep]
            keep_dev = keep.to(dev)
            s.select(keep_dev)
            src, tokens = src[keep_dev], tokens[keep_dev]
            lengths = (s.prompt_len + step + 1).repeat_interleave(K)  # after the new token
            host_lengths = lengths.cpu()
            tables = self._reorder(src.cpu(), host_lengths)
            logits = self.gs.runner.decode(tokens.reshape(-1).int(), lengths.int(), tables,
                                           host_lengths.int(), use_graphs=False)

        yield self._final(context_logits, outputs)

    def _step(self, s: "_State", logits: torch.Tensor, step: int, active: torch.Tensor):
        """One step of transformers' beam search on the state. Returns, per active request,
        the old beam each next beam continues, its new token, and whether it is done."""
        K, G, cfg = self.K, self.G, self.sampling
        n, V = s.run_seq.shape[0], logits.shape[-1]
        cur = s.prompt_len + step  # tokens of every beam so far
        flat = s.run_seq.reshape(n * K, -1)
        lens = cur.repeat_interleave(K)
        log_probs = process_logits(torch.log_softmax(logits.float(), dim=-1), cfg, token_ids=flat,
                                   context_lengths=s.prompt_len.repeat_interleave(K),
                                   sequence_lengths=lens)
        rows = active.to(self.dev).repeat_interleave(K)
        if self.bad is not None:
            log_probs = self.bad.ban(log_probs, flat, lens, rows)
        log_probs = log_probs.reshape(n, K, V)
        total = (log_probs + s.run_score[:, :, None]).reshape(n, K * V)
        top_score, top_idx = torch.topk(total, 2 * K)
        src, tok = top_idx // V, top_idx % V
        top_seq = _gather(s.run_seq, src)
        top_seq.scatter_(2, cur[:, None, None].expand(n, 2 * K, 1), tok[..., None])
        top_lp = _gather(s.run_lp, src)
        top_lp[:, :, step] = log_probs.reshape(n, K * V).gather(1, top_idx)

        ends = torch.full_like(tok, step + 1 == G, dtype=torch.bool)
        if cfg.end_id is not None:
            ends |= tok == cfg.end_id
        if self.stop is not None:
            ends |= self.stop.stopped(top_seq.reshape(n * 2 * K, -1),
                                      (cur + 1).repeat_interleave(2 * K),
                                      active.to(self.dev).repeat_interleave(2 * K)).reshape(n, 2 * K)

        # The next running beams: the best candidates that did not end.
        running = top_score + ends.float() * _NEG
        nxt = torch.topk(running, K).indices
        s.run_seq, s.run_lp = _gather(top_seq, nxt), _gather(top_lp, nxt)
        s.run_score = running.gather(1, nxt)

        # Finished hypotheses: merge the candidates among the first K that ended.
        lp = cfg.length_penalty
        just = ends & (torch.arange(2 * K, device=self.dev) < K)
        cand = top_score / ((step + 1) ** lp)
        full = s.fin_done.all(dim=1, keepdim=True) & (cfg.early_stopping is True)
        cand = cand + full.float() * _NEG + (~s.open).float() * _NEG + (~just).float() * _NEG
        merged = torch.cat((s.fin_score, cand), dim=1)
        best = torch.topk(merged, K).indices
        s.fin_score = merged.gather(1, best)
        s.fin_seq = _gather(torch.cat((s.fin_seq, top_seq), dim=1), best)
        s.fin_lp = _gather(torch.cat((s.fin_lp, top_lp), dim=1), best)
        s.fin_cum = torch.cat((s.fin_cum, top_score), dim=1).gather(1, best)
        s.fin_len = torch.cat((s.fin_len, torch.full_like(top_score, step + 1)), dim=1).gather(1, best)
        s.fin_done = torch.cat((s.fin_done, just), dim=1).gather(1, best)

        # Can a running beam still beat the worst finished hypothesis?
        generated = G if cfg.early_stopping == "never" and lp > 0.0 else step + 1
        best_running = s.run_score[:, :1] / (generated ** lp)
        worst = torch.where(s.fin_done, s.fin_score.min(dim=1, keepdim=True).values, _NEG)
        s.open &= (best_running > worst).any(dim=1, keepdim=True)
        done = ~s.open.squeeze(1) | (s.fin_done.all(dim=1) & (cfg.early_stopping is True))
        if step + 1 == G:
            done = torch.ones_like(done)
        return _gather(src, nxt), tok.gather(1, nxt), done.cpu()

    def _reorder(self, src: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Re-form the beams in the KV cache: next beam j of request i continues old beam
        src[i, j]. Returns the block tables of the next beams, extended to `lengths`."""
        kv, K = self.kv, self.K
        pairs, flat = [], []
        for i, old in enumerate(self.seq_ids):
            new = []
            for j in range(K):
                sid = ("beam", next(self.ids))
                kv.fork_sequence(old[int(src[i, j])], sid)
                new.append(sid)
            for sid in set(old):
                kv.free_sequence(sid)
            self.seq_ids[i] = new
            flat += new
        for sid, n in zip(flat, lengths.tolist()):
            pairs += kv.extend(sid, n)
        copy_blocks(self.gs.runner.kv_cache_pool, pairs)
        return kv.get_block_table(flat).to(self.dev)

    def _record(self, s: "_State", i: int, b: int) -> None:
        """Request b (row i of the state) is done: its finished hypotheses are the result."""
        self.out_ids[b] = s.fin_seq[i].cpu()
        self.out_lens[b] = self.prompt_lens[b] + s.fin_len[i].long().cpu()
        self.out_scores[b] = s.fin_score[i].cpu()
        self.out_cum[b] = s.fin_cum[i].cpu()
        self.out_log_probs[b] = s.fin_lp[i].cpu()

    def _partial(self, s: "_State", active: torch.Tensor, done: torch.Tensor, step: int) -> dict:
        """The done requests' results and the other requests' running beams."""
        ids, lens = self.out_ids.clone(), self.out_lens.clone()
        going = ~done
        if going.any():
            rows, going_dev = active[going], going.to(self.dev)
            ids[rows] = s.run_seq[going_dev].cpu()
            lens[rows] = (s.prompt_len[going_dev] + step + 1).cpu()[:, None]
        return {"output_ids": ids.int(), "sequence_lengths": lens.int(), "done": False}

    def _final(self, context_logits, outputs: dict) -> dict:
        out = {"output_ids": self.out_ids.int(), "sequence_lengths": self.out_lens.int(),
               "sequences_scores": self.out_scores.clone(), "done": True}
        if outputs["log_probs"]:
            out["log_probs"] = self.out_log_probs.clone()
        if outputs["cum_log_probs"]:
            out["cum_log_probs"] = self.out_cum.clone()
        if context_logits is not None:
            out["context_logits"] = context_logits
        return out


class _State:
    """Beam-search tensors of the active requests (rows), on the device. K beams each."""

    def __init__(self, prompts: torch.Tensor, prompt_len: torch.Tensor, K: int, G: int):
        n, dev = prompts.shape[0], prompts.device
        self.prompt_len = prompt_len                        # [n]
        self.run_seq = prompts                              # [n, K, W] running beams' tokens
        self.run_score = torch.full((n, K), _NEG, device=dev)
        self.run_score[:, 0] = 0.0                          # summed log-probs
        self.run_lp = torch.zeros(n, K, G, device=dev)      # each token's log-prob
        self.fin_seq = prompts.clone()                      # finished hypotheses, best first
        self.fin_score = torch.full((n, K), _NEG, device=dev)  # length-normalised
        self.fin_cum = torch.zeros(n, K, device=dev)
        self.fin_len = torch.zeros(n, K, device=dev)         # generated tokens
        self.fin_lp = torch.zeros(n, K, G, device=dev)
        self.fin_done = torch.zeros(n, K, dtype=torch.bool, device=dev)
        self.open = torch.ones(n, 1, dtype=torch.bool, device=dev)

    def select(self, rows: torch.Tensor) -> None:
        for name, value in vars(self).items():
            setattr(self, name, value[rows])


def _gather(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t[i, index[i, j], ...]: beams picked per request."""
    while index.dim() < t.dim():
        index = index.unsqueeze(-1)
    return torch.take_along_dim(t, index, dim=1)
