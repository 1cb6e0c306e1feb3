"""EAGLE-style proposer: a one-layer head drafts from the target's own final hidden states.

The head (trained by drafts/eagle.py; a draft folder whose config.json says "draftgate":
{"kind": "eagle"}) reads, at position t, fc([embed(token_{t+1}); h_t]) where h_t is the
target's final-norm hidden state, runs one llama decoder layer and a final norm, and so predicts
h_{t+1}; the target's output head (over the draft vocabulary) turns that into the draft of token
t + 2. Further drafts feed the predicted state back in.

Its KV (one layer) lives in a pool of its own indexed by the target's block ids and slots. After
every target step the runner hands over the states of the positions that step verified (prefill
chunks; the last real token and the accepted drafts of a decode); they wait in a per-request
buffer and the head runs over them, in one batched pass with other requests':
- when the request drafts (the pass's output at its newest position is its first draft, so
  catching up and the first draft are one forward);
- when FLUSH_TOKENS have piled up (a prefill chunk at once; a request that has not drafted for
  that many steps), which bounds the buffer;
- when the request finishes (in the next step's pass), so a later request that hits its blocks
  in the prefix cache (an agent's next turn) finds head KV written from the target's states
  there; they share that pass with any flush, unless one of their blocks is written in it too,
  as when it has gone to a new request (then a pass of their own first).
Every other request with RIDE_TOKENS or more buffered rides along in such a pass, so a batch that
does not draft shares one pass per about FLUSH_TOKENS steps instead of one per request (a pass
costs a fixed 0.4-1 ms on a CPU, a row about 6 us).
Only the newest position's output is ever read, so the last two passes, and a catch-up's older
positions (SPLIT_ROWS), write KV only: the fc projection, the norm and k/v, without attention
or MLP (3-5x cheaper per position on a CPU). A request the controller does not draft for
therefore costs one such pass per FLUSH_TOKENS positions instead of a full pass every step (at
8 streams on a CPU the per-step pass was 6% of the runner's time while drafts did not pay).
Positions past the accepted ones hold KV written from predicted states; the next pass over the
request overwrites them before anything attends to them, as every pass over a request starts
at its first unprocessed position.

Drafts are greedy (one-hot for the rejection sampler); a request that asks for alternatives also
gets the head's runners-up for its first draft (engine/worker/alternatives.py verifies them). The
head only writes its own pool, so it cannot change the target's output.

Each draft carries the head's softmax probability of it, which the controller's calibration
(engine/spec_decode/calibration.py) turns into the chance the target accepts it; a request's
drafts stop where the chance that all of them survive falls below its min_confidence (the first
draft is always kept), and a request gets a further position only while the draft expected there
(the calibration's next_chance) would still pay: deep drafts where the head is sure, none where
it is guessing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from engine.model.attention_metadata import AttentionMetadata
from engine.spec_decode.calibration import ConfidenceCalibration, DraftChances
from engine.spec_decode.draft_model import DraftModel, top_draft_tokens_with_prob
from engine.spec_decode.proposer import Proposal, ProposalRequest
from engine.worker.kv_cache import KVCacheSpec, allocate_kv_caches


FLUSH_TOKENS = 32  # buffered positions that make a request's head pass run without a draft
# A catch-up chunk at least this long writes all but its newest position with a KV-only pass
# first (measured with the shipped head on 2 CPU cores, bf16, 600-token context: a full pass
# over 4 rows of one request costs what a KV-only pass over 3 plus a full pass over 1 do; at 8
# requests x 4 rows the split is 20% cheaper, at 1 x 31 rows 40%).
SPLIT_ROWS = 4
# Buffered positions that make a request ride along in a pass another one's buffer (or the
# finished requests') started. At 8 chat streams (bf16, no drafts) a round ran ~25 KV-only passes
# of 1-250 rows each, 1-3 ms apiece with the head's weights cold: 1% of the batch's time.
RIDE_TOKENS = 8


@dataclass
class _Buffered:
    """Verified positions [start, start + count) of a request the head has not run over yet."""

    start: int
    block_ids: list[int]  # the runner's list (read-only here; blocks only grow)
    # The runner's token lists (read-only here; they only grow): the head's input at position p
    # is token p + 1, read when a pass runs rather than copied out every step.
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    states: list[torch.Tensor] = field(default_factory=list)  # chunks [n_i, hidden]
    count: int = 0

    def token_ids(self) -> np.ndarray:  # [count] int64: token p + 1 per buffered position p
        return _tokens(self.prompt_token_ids, self.output_token_ids, self.start + 1, self.start + 1 + self.count)

    def split_newest(self) -> tuple[_Buffered, _Buffered]:
        """(positions [start, start + count - 1), the newest position alone); count >= 2."""
        states = torch.cat(self.states)  # [count, hidden]
        last = self.count - 1
        # The newest row is copied: a view would keep the whole chunk (a prefill's) alive while
        # it waits for the request's next pass.
        return (replace(self, states=[states[:last]], count=last),
                replace(self, start=self.start + last, states=[states[last:].clone()], count=1))


class EagleProposer:
    supports_alternatives = True  # runners-up for the first draft come from the same top-k
    supports_confidence = True  # stops a request's drafts by ProposalRequest.min_confidence

    def __init__(self, draft: DraftModel, *, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        if draft.fc_weight is None or draft.arch.num_hidden_layers != 1:
            raise ValueError("an EAGLE head has an fc projection and one decoder layer")
        self.draft = draft
        self.block_size = block_size
        self.device = device
        self.dtype = dtype  # the head's: the target's states are converted as they are buffered
        self.kv_spec = KVCacheSpec(1, draft.arch.num_key_value_heads, draft.arch.head_dim, block_size, dtype)
        self.kv_caches = allocate_kv_caches(self.kv_spec, num_blocks, device)
        self._buffered: dict[str, _Buffered] = {}
        self._finished: list[_Buffered] = []  # buffers of finished requests, run in the next pass
        # req_id -> (its newest verified position P, the head's output there [hidden]): the
        # state that predicts token P + 2, i.e. the first draft of the next step.
        self._newest: dict[str, tuple[int, torch.Tensor]] = {}
        self.pass_seconds = 0.0  # seconds in head passes outside drafting (flushes; diagnostics)
        # Positions the last propose drafted in sequence (the deepest request's; a draft computed
        # and then dropped for its confidence counts: its pass ran). The controller prices by it.
        self.positions_run = 0
        # The chance the target accepts a draft, given the head's probability of it: learnt by
        # the controller, which sets it here (None: the probability itself).
        self.calibration: ConfidenceCalibration | None = None

    @staticmethod
    def kv_bytes_per_block(draft: DraftModel, block_size: int, dtype: torch.dtype) -> int:
        return KVCacheSpec(1, draft.arch.num_key_value_heads, draft.arch.head_dim, block_size, dtype).bytes_per_block

    def forget_blocks(self, block_ids: list[int]) -> None:
        pass  # every pass over a request rewrites its positions from the first unprocessed one

    def _forward(self, input_ids: torch.Tensor, states: torch.Tensor, positions: torch.Tensor,
                 meta: AttentionMetadata, *, kv_only: bool = False) -> torch.Tensor | None:
        """input_ids [n] (token t + 1), states [n, hidden] (state at t), positions [n] (t)
        -> predicted states [n, hidden]; kv_only: only writes the head's KV there (returns
        None), skipping the attention, the MLP and the norm."""
        model = self.draft.model
        embedded = model.embed_tokens(input_ids)  # [n, hidden]
        joined = torch.cat([embedded, states.to(embedded.dtype)], dim=-1)  # [n, 2 * hidden]
        hidden = self.draft.fc(joined)
        if kv_only:
            cos, sin = model.rotary.cos_sin(positions, hidden.dtype)
            model.layers[0].store_kv(hidden, cos, sin, self.kv_caches[0], meta)
            return None
        return model.run_layers(hidden, positions, self.kv_caches, meta)  # the layer and the final norm

    def observe(self, hidden: torch.Tensor, positions: np.ndarray, query_start_loc: list[int],
                requests: list[tuple[str, list[int], list[int], list[int], int]]) -> None:
        """After a target step: hidden [num_tokens, hidden] its final states, positions
        [num_tokens], query_start_loc its rows per request; requests, in row order:
        (req_id, prompt ids, output ids (this step's tokens included), block ids, number of its
        scheduled positions whose states are verified). Buffers them; runs the head over the
        requests that reached FLUSH_TOKENS (and finished requests' leftovers)."""
        for i, (req_id, prompt, output, blocks, num_valid) in enumerate(requests):
            first = query_start_loc[i]
            start = int(positions[first])
            # Position p needs token p + 1: the newest token has no successor yet.
            count = min(num_valid, len(prompt) + len(output) - 1 - start)
            if count <= 0:
                continue
            buffered = self._buffered.get(req_id)
            if buffered is None or buffered.start + buffered.count != start:
                # Nothing buffered, or a gap (the request was preempted and recomputes): the
                # request's positions before `start` are as the last pass left them.
                buffered = self._buffered[req_id] = _Buffered(start, blocks, prompt, output)
            # A copy of its own rows (the step's tensor is not ours), in the head's dtype: a view
            # of one copy of the whole step would keep every request's rows, prefill chunks
            # included, alive while any one request's buffer waits (up to FLUSH_TOKENS steps).
            buffered.states.append(hidden[first: first + count].to(self.dtype, copy=True))
            buffered.count += count
            self._newest.pop(req_id, None)  # stale: newer positions wait in the buffer
        # Finished requests' leftovers run at once, here and not in a later draft's catch-up,
        # which the controller bills to the draft model (as it would riders: the same reason
        # they stay out of catch-ups). Billed, the upkeep of requests that do not draft made the
        # plan draft less: agent turns at 8 streams drafted 1,075 tokens against 1,449 and ran at
        # 1.035x against 1.102x (bf16, 6 rounds side by side).
        if self._finished or any(b.count >= FLUSH_TOKENS for b in self._buffered.values()):
            started = time.perf_counter()
            with torch.inference_mode():
                self._write_kv(self._take_riders())
            self.pass_seconds += time.perf_counter() - started

    def _take_riders(self) -> list[_Buffered]:
        """The older positions of every buffer with RIDE_TOKENS or more, taken out for a KV-only
        pass: the newest position stays buffered, so a later draft's catch-up is a full pass over
        it, and nothing reads the others' outputs."""
        heads = []
        for req_id, buffered in self._buffered.items():
            if buffered.count >= RIDE_TOKENS:
                head, self._buffered[req_id] = buffered.split_newest()
                heads.append(head)
        return heads

    def _write_kv(self, heads: list[_Buffered]) -> None:
        """One KV-only pass over heads and the finished requests' leftovers. Two writes to one
        slot in one pass would race, and a finished request's blocks may already belong to a new
        request whose write must come last: if any block is written by both, the finished
        requests' run first, in a pass of their own."""
        finished, self._finished = self._finished, []
        if finished and _written_blocks(finished, self.block_size) & _written_blocks(heads, self.block_size):
            self._pass(finished, kv_only=True)
            finished = []
        self._pass(finished + heads, kv_only=True)

    def _catch_up(self, req_ids: list[str]) -> None:
        """Runs the head over req_ids' buffers, leaving each one's output at its newest position
        in _newest; a long buffer writes its older positions' KV alone first (SPLIT_ROWS), in a
        KV-only pass with any finished requests' leftovers (written before anything attends to
        them)."""
        chunks, heads = [], []
        for req_id in req_ids:
            chunk = self._buffered.pop(req_id)
            if chunk.count >= SPLIT_ROWS:
                head, chunk = chunk.split_newest()
                heads.append(head)
            chunks.append(chunk)
        self._write_kv(heads)
        if chunks:
            out = self._pass(chunks)
            assert out is not None
            last = np.cumsum([c.count for c in chunks]) - 1
            for req_id, chunk, row in zip(req_ids, chunks, last.tolist()):
                self._newest[req_id] = (chunk.start + chunk.count - 1, out[row])

    def _pass(self, chunks: list[_Buffered], *, kv_only: bool = False) -> torch.Tensor | None:
        """One head forward over chunks: outputs [sum(counts), hidden], or None if kv_only."""
        if not chunks:
            return None
        meta = AttentionMetadata.build(query_lens=[c.count for c in chunks],
                                       seq_lens=[c.start + c.count for c in chunks],
                                       block_ids=[c.block_ids for c in chunks], block_size=self.block_size,
                                       device=self.device)
        ids = torch.from_numpy(np.concatenate([c.token_ids() for c in chunks])).to(self.device)
        states = torch.cat([s for c in chunks for s in c.states])  # [sum(counts), hidden]
        positions = torch.from_numpy(np.concatenate(
            [np.arange(c.start, c.start + c.count) for c in chunks])).to(self.device)
        return self._forward(ids, states, positions, meta, kv_only=kv_only)

    @torch.inference_mode()
    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
        drafts: dict[str, list[int]] = {r.req_id: [] for r in requests}
        # Catch up (the same pass gives each request's first draft).
        self._catch_up([r.req_id for r in requests if r.req_id in self._buffered])
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
        self.positions_run = 0
        if not active:
            return {req_id: Proposal(tokens) for req_id, tokens in drafts.items()}
        states = torch.stack([state[r.req_id] for r, _ in active])  # [n, hidden]
        # The first position's runners-up are the head's next most likely tokens (one top-k).
        width = 1 + max(r.num_alternatives for r, _ in active)
        top, best_prob = top_draft_tokens_with_prob(self.draft, states, width)
        top_rows, probs = top.tolist(), best_prob.tolist()  # [n, width], [n]
        tokens = [row[0] for row in top_rows]
        alternatives = {r.req_id: row[1: 1 + r.num_alternatives] for (r, _), row in zip(active, top_rows)}
        chances = DraftChances(self.calibration, [r.req_id for r, _ in active])
        step = 1
        while True:
            # Each request's token is kept while the chance that all its drafts survive pays
            # (the first always: the plan priced it); a further position runs only for those
            # for which the draft expected there could still pay (calibration.py).
            kept = []
            for i, ((r, limit), token) in enumerate(zip(active, tokens)):
                if not chances.keep(r, probs[i]):
                    continue
                drafts[r.req_id].append(token)
                if limit > step and chances.worth_another(r):
                    kept.append(i)
            if not kept:
                break
            keep = torch.tensor(kept, device=self.device)
            states = states.index_select(0, keep)
            active = [active[i] for i in kept]
            inputs = torch.tensor([drafts[r.req_id][-1] for r, _ in active], dtype=torch.int64, device=self.device)
            at = [position[r.req_id] + step for r, _ in active]
            meta = AttentionMetadata.build(query_lens=[1] * len(active), seq_lens=[p + 1 for p in at],
                                           block_ids=[r.block_ids for r, _ in active],
                                           block_size=self.block_size, device=self.device)
            states = self._forward(inputs, states, torch.tensor(at, dtype=torch.int64, device=self.device), meta)
            top, best_prob = top_draft_tokens_with_prob(self.draft, states, 1)
            tokens, probs = top[:, 0].tolist(), best_prob.tolist()
            step += 1
        self.positions_run = step
        return {req_id: chances.proposal(req_id, tokens, alternatives.get(req_id))
                for req_id, tokens in drafts.items()}

    def finish(self, req_id: str, output_token_ids: list[int] | None) -> None:
        self._newest.pop(req_id, None)
        buffered = self._buffered.pop(req_id, None)
        # A finished request's last positions still get head KV (its blocks stay in the prefix
        # cache); a preempted one recomputes them anyway.
        if buffered is not None and output_token_ids is not None:
            self._finished.append(buffered)


def _written_blocks(chunks: list[_Buffered], block_size: int) -> set[int]:
    """The block ids a pass over chunks writes KV in."""
    return {block for c in chunks
            for block in c.block_ids[c.start // block_size: (c.start + c.count - 1) // block_size + 1]}


def _tokens(prompt: list[int], output: list[int], start: int, end: int) -> np.ndarray:  # [end - start] int64
    num_prompt = len(prompt)
    if end <= num_prompt:
        return np.asarray(prompt[start:end], dtype=np.int64)
    if start >= num_prompt:
        return np.asarray(output[start - num_prompt: end - num_prompt], dtype=np.int64)
    return np.asarray(prompt[start:] + output[: end - num_prompt], dtype=np.int64)
