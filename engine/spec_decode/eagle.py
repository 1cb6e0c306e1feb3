"""EAGLE-style proposer: a one-layer head drafts from the target's own final hidden states.

The head (trained by drafts/eagle.py; a draft folder whose config.json says "draftgate":
{"kind": "eagle"}) reads, at position t, fc([embed(token_{t+1}); h_t]) where h_t is the
target's final-norm hidden state, runs one llama decoder layer and a final norm, and so predicts
h_{t+1}; the target's output head (over the draft vocabulary) turns that into the draft of token
t + 2. Further drafts feed the predicted state back in.

Its KV (one layer) lives in a pool of its own indexed by the target's block ids and slots, and
is written eagerly: after every target step the head runs over every position whose target
state this step produced and whose next token is known (prefill chunks, the verified part of a
decode: the last real token and the accepted drafts). That keeps the invariant "every position
the target has computed, except a request's newest, has head KV", so a prefix hit finds the head
KV the earlier request wrote in the same slots, preemption needs nothing, and the first draft
of the next step comes out of this same forward (its output at the request's newest verified
position). The eager pass costs one layer over the step's tokens; the k - 1 further drafts cost
one-layer steps for the requests that draft. Positions past the accepted ones hold KV written
from predicted states; the next eager pass overwrites them before anything attends to them.

Drafts are greedy (one-hot for the rejection sampler); the head only writes its own pool, so it
cannot change the target's output.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from engine.model.attention_metadata import AttentionMetadata
from engine.spec_decode.draft_model import DraftModel, greedy_draft_tokens
from engine.spec_decode.proposer import Proposal, ProposalRequest
from engine.worker.kv_cache import KVCacheSpec, allocate_kv_caches
from kernels.onednn_linear import onednn_linear

SECONDS_EMA = 0.2  # weight of the newest step in the measured seconds per drafted token


class EagleProposer:
    def __init__(self, draft: DraftModel, *, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        if draft.fc_weight is None or draft.arch.num_hidden_layers != 1:
            raise ValueError("an EAGLE head has an fc projection and one decoder layer")
        self.draft = draft
        self.block_size = block_size
        self.device = device
        self.kv_spec = KVCacheSpec(1, draft.arch.num_key_value_heads, draft.arch.head_dim, block_size, dtype)
        self.kv_caches = allocate_kv_caches(self.kv_spec, num_blocks, device)
        # req_id -> (its newest verified position P, the head's output there [hidden]): the
        # state that predicts token P + 2, i.e. the first draft of the next step.
        self._newest: dict[str, tuple[int, torch.Tensor]] = {}
        self.seconds_per_token = 0.0  # what one further drafted token costs, measured
        self.observe_seconds = 0.0  # the eager passes' total (diagnostics)

    @staticmethod
    def kv_bytes_per_block(draft: DraftModel, block_size: int, dtype: torch.dtype) -> int:
        return KVCacheSpec(1, draft.arch.num_key_value_heads, draft.arch.head_dim, block_size, dtype).bytes_per_block

    def forget_blocks(self, block_ids: list[int]) -> None:
        pass  # written eagerly: a block's head KV is rewritten whenever the target writes it

    def _forward(self, input_ids: torch.Tensor, states: torch.Tensor, positions: torch.Tensor,
                 meta: AttentionMetadata) -> torch.Tensor:
        """input_ids [n] (token t + 1), states [n, hidden] (state at t), positions [n] (t)
        -> predicted states [n, hidden]."""
        model = self.draft.model
        embedded = model.embed_tokens(input_ids)  # [n, hidden]
        joined = torch.cat([embedded, states.to(embedded.dtype)], dim=-1)  # [n, 2 * hidden]
        if self.draft.fc_packed is not None:
            hidden = onednn_linear(joined, self.draft.fc_packed)
        else:
            hidden = F.linear(joined, self.draft.fc_weight)
        cos, sin = model.rotary.cos_sin(positions, hidden.dtype)
        hidden, residual = model.layers[0](hidden, None, cos, sin, self.kv_caches[0], meta)
        out, _ = model.norm(hidden, residual)
        return out

    @torch.inference_mode()
    def observe(self, hidden: torch.Tensor, positions: np.ndarray, query_start_loc: list[int],
                requests: list[tuple[str, list[int], list[int], list[int], int]]) -> None:
        """After a target step: hidden [num_tokens, hidden] its final states, positions
        [num_tokens], query_start_loc its rows per request; requests, in row order:
        (req_id, prompt ids, output ids (this step's tokens included), block ids, number of its
        scheduled positions whose states are verified)."""
        started = time.perf_counter()
        rows, ids, pos, query_lens, seq_lens, block_ids, kept = [], [], [], [], [], [], []
        for i, (req_id, prompt, output, blocks, num_valid) in enumerate(requests):
            first = query_start_loc[i]
            start = int(positions[first])
            num_tokens = len(prompt) + len(output)
            # Position p needs token p + 1: the newest token has no successor yet.
            count = min(num_valid, num_tokens - 1 - start)
            if count <= 0:
                self._newest.pop(req_id, None)
                continue
            rows.append(np.arange(first, first + count))
            ids.append(_tokens(prompt, output, start + 1, start + 1 + count))
            pos.append(np.arange(start, start + count))
            query_lens.append(count)
            seq_lens.append(start + count)
            block_ids.append(blocks)
            kept.append((req_id, start + count - 1))
        if not kept:
            return
        device = self.device
        meta = AttentionMetadata.build(query_lens=query_lens, seq_lens=seq_lens, block_ids=block_ids,
                                       block_size=self.block_size, device=device)
        row_index = torch.from_numpy(np.concatenate(rows)).to(device)
        out = self._forward(torch.from_numpy(np.concatenate(ids)).to(device), hidden.index_select(0, row_index),
                            torch.from_numpy(np.concatenate(pos)).to(device), meta)  # [sum(query_lens), hidden]
        last = np.cumsum(query_lens) - 1
        for (req_id, position), row in zip(kept, last.tolist()):
            self._newest[req_id] = (position, out[row])
        self.observe_seconds += time.perf_counter() - started

    @torch.inference_mode()
    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
        started = time.perf_counter()
        drafts: dict[str, list[int]] = {r.req_id: [] for r in requests}
        # The head's newest output sits at P (the newest verified position); draft j is token
        # P + 1 + j and its feeding step writes head KV at P + j: never past the owned blocks.
        active, position, state = [], {}, {}
        for r in requests:
            newest = self._newest.get(r.req_id)
            num_tokens = len(r.prompt_token_ids) + len(r.output_token_ids)
            if newest is None or newest[0] != num_tokens - 2:
                continue  # no verified state for this request's newest token (not observed)
            limit = min(r.num_drafts, len(r.block_ids) * self.block_size - newest[0])
            if limit > 0:
                active.append((r, limit))
                position[r.req_id] = newest[0]
                state[r.req_id] = newest[1]
        if not active:
            return {req_id: Proposal(tokens) for req_id, tokens in drafts.items()}
        states = torch.stack([state[r.req_id] for r, _ in active])  # [n, hidden]
        tokens = greedy_draft_tokens(self.draft, states).tolist()
        step = 1
        while True:
            for (r, _), token in zip(active, tokens):
                drafts[r.req_id].append(token)
            still = [(i, r, limit) for i, (r, limit) in enumerate(active) if limit > step]
            if not still:
                break
            keep = torch.tensor([i for i, _, _ in still], device=self.device)
            states = states.index_select(0, keep)
            active = [(r, limit) for _, r, limit in still]
            inputs = torch.tensor([drafts[r.req_id][-1] for r, _ in active], dtype=torch.int64, device=self.device)
            at = [position[r.req_id] + step for r, _ in active]
            meta = AttentionMetadata.build(query_lens=[1] * len(active), seq_lens=[p + 1 for p in at],
                                           block_ids=[r.block_ids for r, _ in active],
                                           block_size=self.block_size, device=self.device)
            states = self._forward(inputs, states, torch.tensor(at, dtype=torch.int64, device=self.device), meta)
            tokens = greedy_draft_tokens(self.draft, states).tolist()
            step += 1
        num_drafted = sum(len(t) for t in drafts.values())
        if num_drafted:
            seconds = (time.perf_counter() - started) / num_drafted
            self.seconds_per_token = (seconds if self.seconds_per_token == 0.0 else
                                      (1 - SECONDS_EMA) * self.seconds_per_token + SECONDS_EMA * seconds)
        return {req_id: Proposal(tokens) for req_id, tokens in drafts.items()}

    def finish(self, req_id: str, output_token_ids: list[int] | None) -> None:
        self._newest.pop(req_id, None)


def _tokens(prompt: list[int], output: list[int], start: int, end: int) -> np.ndarray:  # [end - start] int64
    num_prompt = len(prompt)
    if end <= num_prompt:
        return np.asarray(prompt[start:end], dtype=np.int64)
    if start >= num_prompt:
        return np.asarray(output[start - num_prompt: end - num_prompt], dtype=np.int64)
    return np.asarray(prompt[start:] + output[: end - num_prompt], dtype=np.int64)
