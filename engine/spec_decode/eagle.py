"""EAGLE-style proposer: a one-layer head drafts from the target's own final hidden states.

The head (trained by drafts/eagle.py; a draft folder whose config.json says "draftgate":
{"kind": "eagle"}) reads, at position t, fc([embed(token_{t+1}); h_t]) where h_t is the
target's final-norm hidden state, runs one llama decoder layer and a final norm, and so predicts
h_{t+1}; the target's output head (over the draft vocabulary) turns that into the draft of token
t + 2. Further drafts feed the predicted state back in.

Its KV (one layer) lives in a pool of its own indexed by the target's block ids and slots, and so
do the target's states: after every target step the runner writes the states of all its rows
into the state pool at their slots, one copy for the whole step. A rejected draft's row is
written too, with the draft as its token: its position lies past the request's newest verified
one, which is as far as the head reads, and the step that verifies that position later writes
it again (a row's state is a function of the tokens up to it, and so is right wherever its
token and those before it are). Sorting the verified rows out cost more than the copy: a decode
step's Python runs with caches the weights have just streamed through (~10-30 us an operation),
and the upkeep of a one-stream step went from 0.16-0.18 ms to 0.09 (at 8 streams it stays ~0.1
ms, the copy itself). Since 2026-12-06 that copy waits too: the step's states are kept by
reference and copied when the head next reads them (observe), one copy for all the steps
between: at 8 chat streams on an AMX Xeon, 0.027 ms a step against 0.092 copying at once (both
ways on the same 1,024 steps, the copies included). The head's KV is filled lazily from them,
like a draft model's (draft_model.py): only when a request drafts does the head run,
first over the positions it has no KV for (its catch-up, in the same pass as the first draft).
A request the plan does not draft for costs the head nothing but that copy; at 8 streams on a
CPU, where the head's drafts rarely pay, writing every position's KV as it came cost ~1% of the
batch's time (20 us a position, fc and k/v over 2 cores, float32). A finished request leaves its
states in its blocks, so a later request that hits them in the prefix cache (an agent's next
turn) catches up from them.

Which slots hold valid head KV and states is recorded per slot, as the draft model does: the
state at position p is a function of tokens 0..p and is recorded with token p; the head's KV at
p reads token p + 1 and state p, and is recorded with token p + 1. A request's KV (or state) at
p is valid when the records of its positions up to p match its tokens: every write is made over
a context that matched the records before it. A freshly allocated block forgets its records
(forget_blocks); a cached block keeps them; after drafting, the records past the newest verified
position are forgotten (the drafts wrote KV there from predicted states). One exception: the
KV at a block's last slot reads the first token of the next block, which requests sharing the
block need not share; a record there that is another token is taken as valid (a key of one
position written for another successor, which changes drafts, never the output), or two
requests sharing a system prompt would rewrite each other's KV from there on at every step.
Each request remembers how far its KV was valid at its last catch-up, so a step checks only the
records of its newest positions. Positions whose states the head never got (blocks cached
before it was built: set_speculative_method builds a new one) are skipped: their KV stays as it
is, which only costs drafts.

A catch-up of SPLIT_ROWS positions or more writes all but its newest one with a KV-only pass
(the fc projection, the norm and k/v, without attention or MLP: 3-5x cheaper per position on a
CPU), since only the newest position's output is read. The controller does not bill those
passes to the head's drafts (kv_only_seconds): they write positions the head skipped, work that
stays ready for whenever the head drafts again.

Drafts are greedy (one-hot for the rejection sampler); a request that asks for alternatives also
gets the head's runners-up for its first draft (engine/worker/alternatives.py verifies them). The
head only writes its own pools, so it cannot change the target's output.

Each draft carries the head's softmax probability of it, which the controller's calibration
(engine/spec_decode/calibration.py) turns into the chance the target accepts it; a request's
drafts stop where the chance that all of them survive falls below its min_confidence (the first
draft is always kept), and a request gets a further position only while the draft expected there
(the calibration's next_chance) would still pay: deep drafts where the head is sure, none where
it is guessing.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from engine.model.attention_metadata import AttentionMetadata
from engine.spec_decode.calibration import ConfidenceCalibration, DraftChances
from engine.spec_decode.draft_model import DraftModel, position_slots, top_draft_tokens_with_prob
from engine.spec_decode.eagle_compiled import CompiledEagleHead
from engine.spec_decode.proposer import Proposal, ProposalRequest
from engine.worker.kv_cache import KVCacheSpec, allocate_kv_caches


# A catch-up chunk at least this long writes all but its newest position with a KV-only pass
# first (measured with the shipped head on 2 CPU cores, bf16, 600-token context: a full pass
# over 4 rows of one request costs what a KV-only pass over 3 plus a full pass over 1 do; at 8
# requests x 4 rows the split is 20% cheaper, at 1 x 31 rows 40%).
SPLIT_ROWS = 4
# On a CPU a KV-only pass runs a multiple of KV_ONLY_ROWS_STEP rows, at most KV_ONLY_MAX_ROWS
# (a longer catch-up runs several), the padding rows storing in spare blocks past the target's:
# oneDNN builds its products' kernels per row count, 1-4.7 ms each for the fc product at a count
# not seen yet against 0.15-0.8 warm (bf16, AMX Xeon, 2 threads, 16 to 512 rows), and a
# catch-up's count is whatever the head skipped. Padded to the block size (16) as before, an
# exploring step at 8 code streams, after ~32 skipped steps, spent 9-10 ms in KV-only passes over
# ~256-800 rows, mostly building kernels for counts it had not seen; its 5 accepted drafts were
# worth ~16 ms and never paid the ~17 ms it cost, so the account never reopened. Eight counts
# (64 to 512) are built once; 63 padding rows at most cost less than one build.
KV_ONLY_ROWS_STEP = 64
KV_ONLY_MAX_ROWS = 512
# Observed states wait at most this many rows before they are copied into the state pool
# (observe): a copy per ~256 decode steps at 8 streams, one per prefill chunk.
PENDING_ROWS = 2048


@dataclass
class _Chunk:
    """Positions [start, start + count) of a request for one head pass: their input tokens
    (token p + 1 each), their slots, and the request's block table."""

    start: int
    count: int
    tokens: np.ndarray  # [count] int64
    slots: np.ndarray  # [count] int64
    block_ids: list[int]

    def split_newest(self) -> tuple[_Chunk, _Chunk]:
        """(positions [start, start + count - 1), the newest position alone); count >= 2."""
        last = self.count - 1
        return (_Chunk(self.start, last, self.tokens[:last], self.slots[:last], self.block_ids),
                _Chunk(self.start + last, 1, self.tokens[last:], self.slots[last:], self.block_ids))


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
        self.dtype = dtype  # the head's: the target's states are converted as they are stored
        self.kv_spec = KVCacheSpec(1, draft.arch.num_key_value_heads, draft.arch.head_dim, block_size, dtype)
        # Blocks past the target's: where a KV-only pass's padding rows store (_kv_only_passes).
        spare_blocks = -(-(KV_ONLY_ROWS_STEP - 1) // block_size)
        self.kv_caches = allocate_kv_caches(self.kv_spec, num_blocks + spare_blocks, device)
        self._padding_slots = np.arange(num_blocks * block_size, (num_blocks + spare_blocks) * block_size,
                                        dtype=np.int64)
        num_slots = num_blocks * block_size
        self.states = torch.zeros(num_slots, draft.arch.hidden_size, dtype=dtype, device=device)  # [slots, hidden]
        self._state_tokens = np.full(num_slots, -1, dtype=np.int64)  # token p of the state at p's slot
        self._kv_tokens = np.full(num_slots, -1, dtype=np.int64)  # token p + 1 of the head's KV at p's slot
        # The same records by block ([num_blocks, block_size] views): a block forgets in one index.
        self._state_tokens_by_block = self._state_tokens.reshape(num_blocks, block_size)
        self._kv_tokens_by_block = self._kv_tokens.reshape(num_blocks, block_size)
        # States observed but not yet copied into self.states, oldest first: (the step's final
        # states [rows (+ more rows), hidden], their slots [rows]); see observe.
        self._pending: list[tuple[torch.Tensor, np.ndarray]] = []
        self._pending_rows = 0
        self._valid_through: dict[str, int] = {}  # req_id -> positions [0, n) with valid KV at its last catch-up
        self.num_kv_positions = 0  # positions the head wrote KV for from target states (diagnostics)
        self.kv_only_seconds = 0.0  # the last propose's KV-only passes (not billed to its drafts)
        # Positions the last propose drafted in sequence (the deepest request's; a draft computed
        # and then dropped for its confidence counts: its pass ran). The controller prices by it.
        self.positions_run = 0
        # The chance the target accepts a draft, given the head's probability of it: learnt by
        # the controller, which sets it here (None: the probability itself).
        self.calibration: ConfidenceCalibration | None = None

    @staticmethod
    def kv_bytes_per_block(draft: DraftModel, block_size: int, dtype: torch.dtype) -> int:
        """Its KV and the target states it keeps, per block of the target's."""
        kv = KVCacheSpec(1, draft.arch.num_key_value_heads, draft.arch.head_dim, block_size, dtype).bytes_per_block
        return kv + block_size * draft.arch.hidden_size * dtype.itemsize

    def forget_blocks(self, block_ids: list[int]) -> None:
        """Blocks just allocated afresh: their states and head KV belong to another context."""
        blocks = np.asarray(block_ids, dtype=np.int64)  # (converted once for both records)
        self._state_tokens_by_block[blocks] = -1
        self._kv_tokens_by_block[blocks] = -1

    def _forward(self, input_ids: torch.Tensor, states: torch.Tensor, positions: torch.Tensor,
                 meta: AttentionMetadata, *, kv_only: bool = False) -> torch.Tensor | None:
        """input_ids [n] (token t + 1), states [n, hidden] (state at t), positions [n] (t)
        -> predicted states [n, hidden]; kv_only: only writes the head's KV there (returns
        None), skipping the attention, the MLP and the norm."""
        if not kv_only:
            compiled = self.compiled
            out = compiled.forward(input_ids, states, positions, meta) if compiled is not None else None
            if out is not None:
                return out
        model = self.draft.model
        embedded = model.embed_tokens(input_ids)  # [n, hidden]
        joined = torch.cat([embedded, states.to(embedded.dtype)], dim=-1)  # [n, 2 * hidden]
        hidden = self.draft.fc(joined)
        if kv_only:
            cos, sin = model.rotary.cos_sin(positions, hidden.dtype)
            model.layers[0].store_kv(hidden, cos, sin, self.kv_caches[0], meta)
            return None
        return model.run_layers(hidden, positions, self.kv_caches, meta)  # the layer and the final norm

    @functools.cached_property
    def compiled(self) -> CompiledEagleHead | None:
        """Its passes and greedy tokens in one compiled call each where that applies
        (eagle_compiled.py), built on first use; None: the Python path."""
        return CompiledEagleHead.build(self.draft, self.kv_caches, self.device, self.dtype)

    def _top1(self, states: torch.Tensor) -> tuple[list[int], list[float]]:
        """states [n, hidden] -> each row's greedy draft token and its probability."""
        compiled = self.compiled
        found = compiled.top1(states) if compiled is not None else None
        if found is None:
            top, best_prob = top_draft_tokens_with_prob(self.draft, states, 1)
            return top[:, 0].tolist(), best_prob.tolist()
        tokens, probs = found
        return tokens.tolist(), probs.tolist()

    def observe(self, hidden: torch.Tensor, tokens: np.ndarray, slot_mapping: np.ndarray) -> None:
        """After a target step: hidden [num_rows (+ more rows), hidden] its final states (not
        written to afterwards: the copy may come later); tokens and slot_mapping [num_rows] its
        rows' tokens (the token at the row's position: the input, or the runner-up accepted in
        its place) and slots. Stores every row's state at its slot, a rejected draft's too (see
        the module docstring: the head never reads it).

        The records are written now; the states themselves are copied when the head next reads
        them, or once PENDING_ROWS rows wait (_store_pending): at 8 streams, where the head
        rarely drafts, a copy per step cost ~0.06 ms of a 24 ms step (its 4 tensor operations
        right after a forward that streamed the weights through the caches), and one copy for
        the steps in between costs a fraction of that. A record forgotten meanwhile (a block
        allocated afresh) stays forgotten: the late copy writes data no valid record points
        to, and the copies keep their order, so a slot ends with its newest state."""
        self._state_tokens[slot_mapping] = tokens
        self._pending.append((hidden, slot_mapping))  # (its first len(slot_mapping) rows: sliced when copied)
        self._pending_rows += len(slot_mapping)
        if self._pending_rows >= PENDING_ROWS:
            self._store_pending()

    def _store_pending(self) -> None:
        """Copies the observed states into self.states, in one operation; a slot observed more
        than once (a rejected draft's row, written again when its position is verified) gets
        its newest state."""
        pending = self._pending
        if not pending:
            return
        if len(pending) == 1:
            hidden, slots = pending[0]
            rows = hidden[: len(slots)]
        else:
            slots = np.concatenate([slots for _, slots in pending])
            rows = torch.cat([hidden[: len(slots)] for hidden, slots in pending])  # [sum of rows, hidden]
            # (index_copy_ leaves the order of repeated indices open: keep each slot's last row.)
            reversed_unique, first_from_end = np.unique(slots[::-1], return_index=True)
            if len(reversed_unique) < len(slots):
                keep = len(slots) - 1 - first_from_end
                slots = slots[keep]
                rows = rows.index_select(0, torch.from_numpy(keep))
        self.states.index_copy_(0, torch.from_numpy(slots).to(self.device), rows.to(self.dtype))
        self._pending = []
        self._pending_rows = 0

    def _catch_up(self, requests: list[ProposalRequest]) -> dict[str, tuple[int, torch.Tensor]]:
        """Runs the head over each request's positions without valid KV, through its newest
        verified position P (the token after it is its newest token): req_id -> (P, the head's
        output there [hidden], the state that predicts token P + 2, i.e. its first draft).
        Requests without the target's state at P (not observed) are left out; positions before
        P without one are skipped. A long chunk writes its older positions' KV alone first
        (SPLIT_ROWS), in one KV-only pass for all."""
        chunks, older = [], []
        for r in requests:
            newest = len(r.prompt_token_ids) + len(r.output_token_ids) - 2  # P
            if newest < 0:
                continue
            # Positions before the last catch-up's newest were valid then and stay so: only the
            # request's own later writes (drafts, past it) or a shared block's last slot change.
            begin = min(self._valid_through.get(r.req_id, 0), newest)
            context = _tokens(r.prompt_token_ids, r.output_token_ids, begin, newest + 2)  # tokens begin..P+1
            slots = position_slots(r.block_ids, self.block_size, begin, newest + 1)  # positions begin..P
            recorded = self._kv_tokens[slots]
            block_last = slots % self.block_size == self.block_size - 1
            stale = np.flatnonzero((recorded != context[1:]) & ~((recorded >= 0) & block_last))
            start = min(int(stale[0]) if stale.size else newest - begin, newest - begin)  # P runs always
            missing = np.flatnonzero(self._state_tokens[slots[start:]] != context[start:-1])
            if missing.size:
                if missing[-1] == len(slots) - 1 - start:
                    continue  # no state at P: nothing to draft from
                # States never handed over (blocks cached before this head was built): those
                # positions keep whatever KV they hold, which only costs drafts.
                start += int(missing[-1]) + 1
            chunk = _Chunk(begin + start, len(slots) - start, context[start + 1:], slots[start:], r.block_ids)
            self._valid_through[r.req_id] = newest + 1
            if chunk.count >= SPLIT_ROWS:
                head, chunk = chunk.split_newest()
                older.append(head)
            chunks.append((r.req_id, chunk))
        started = time.perf_counter()
        self._pass(older, kv_only=True)
        self.kv_only_seconds += time.perf_counter() - started
        if not chunks:
            return {}
        out = self._pass([chunk for _, chunk in chunks])
        assert out is not None
        last = np.cumsum([chunk.count for _, chunk in chunks]) - 1
        return {req_id: (chunk.start + chunk.count - 1, out[row])
                for (req_id, chunk), row in zip(chunks, last.tolist())}

    def _pass(self, chunks: list[_Chunk], *, kv_only: bool = False) -> torch.Tensor | None:
        """One head forward over chunks, from the stored target states: outputs [sum(counts),
        hidden], or None if kv_only. Records what it wrote."""
        if not chunks:
            return None
        meta = AttentionMetadata.build(query_lens=[c.count for c in chunks],
                                       seq_lens=[c.start + c.count for c in chunks],
                                       block_ids=[c.block_ids for c in chunks], block_size=self.block_size,
                                       device=self.device)
        tokens = np.concatenate([c.tokens for c in chunks])
        slots = np.concatenate([c.slots for c in chunks])
        positions = np.concatenate([np.arange(c.start, c.start + c.count) for c in chunks])
        self._store_pending()
        states = self.states.index_select(0, torch.from_numpy(slots).to(self.device))  # [sum(counts), hidden]
        out = None
        if kv_only and self.device.type == "cpu":
            self._kv_only_passes(tokens, states, positions, slots, meta)
        else:
            out = self._forward(torch.from_numpy(tokens).to(self.device), states,
                                torch.from_numpy(positions).to(self.device), meta, kv_only=kv_only)
        self._kv_tokens[slots] = tokens
        self.num_kv_positions += len(slots)
        return out

    def _kv_only_passes(self, tokens: np.ndarray, states: torch.Tensor, positions: np.ndarray,
                        slots: np.ndarray, meta: AttentionMetadata) -> None:
        """On a CPU, a KV-only pass's rows (tokens, positions, slots [n]; states [n, hidden]) in
        passes of at most KV_ONLY_MAX_ROWS rows, each padded to a multiple of KV_ONLY_ROWS_STEP:
        oneDNN then builds its kernels for a few row counts once (see KV_ONLY_ROWS_STEP). The
        padding rows store their keys in the spare blocks. (Here and not in the shared oneDNN
        product: padding every product's rows past 32 made the target's prefill 5.4% dearer once
        its lengths had been seen, docs/benchmarks.md.)"""
        for begin in range(0, len(slots), KV_ONLY_MAX_ROWS):
            end = min(len(slots), begin + KV_ONLY_MAX_ROWS)
            padding = -(end - begin) % KV_ONLY_ROWS_STEP
            zeros = np.zeros(padding, dtype=np.int64)
            piece = states[begin:end]  # [end - begin, hidden]
            if padding:
                piece = torch.cat([piece, piece.new_zeros(padding, piece.shape[1])])
            self._forward(torch.from_numpy(np.concatenate([tokens[begin:end], zeros])).to(self.device), piece,
                          torch.from_numpy(np.concatenate([positions[begin:end], zeros])).to(self.device),
                          replace(meta, slot_mapping=torch.from_numpy(
                              np.concatenate([slots[begin:end], self._padding_slots[:padding]])).to(self.device)),
                          kv_only=True)

    @torch.inference_mode()
    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
        self.kv_only_seconds = 0.0
        return self._draft(requests, self._catch_up(requests))

    def _draft(self, requests: list[ProposalRequest],
               newest: dict[str, tuple[int, torch.Tensor]]) -> dict[str, Proposal]:
        """Drafts from each request's newest head output (newest: _catch_up's)."""
        drafts: dict[str, list[int]] = {r.req_id: [] for r in requests}
        # The head's newest output sits at P (the newest verified position); draft j is token
        # P + 1 + j and its feeding step writes head KV at P + j: never past the owned blocks.
        active, position, state = [], {}, {}
        for r in requests:
            if r.req_id not in newest:
                continue  # no verified state for this request's newest token (not observed)
            at, out = newest[r.req_id]
            limit = min(r.num_drafts, len(r.block_ids) * self.block_size - at)
            if limit > 0:
                active.append((r, limit))
                position[r.req_id] = at
                state[r.req_id] = out
        self.positions_run = 0
        if not active:
            return {req_id: Proposal(tokens) for req_id, tokens in drafts.items()}
        states = torch.stack([state[r.req_id] for r, _ in active])  # [n, hidden]
        # The first position's runners-up are the head's next most likely tokens (one top-k).
        width = 1 + max(r.num_alternatives for r, _ in active)
        if width == 1:
            tokens, probs = self._top1(states)
            alternatives = {}
        else:
            top, best_prob = top_draft_tokens_with_prob(self.draft, states, width)
            top_rows, probs = top.tolist(), best_prob.tolist()  # [n, width], [n]
            tokens = [row[0] for row in top_rows]
            alternatives = {r.req_id: row[1: 1 + r.num_alternatives] for (r, _), row in zip(active, top_rows)}
        chances = DraftChances(self.calibration, [r.req_id for r, _ in active])
        predicted: dict[str, int] = {}  # req_id -> positions after P it wrote KV at
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
            for r, _ in active:
                predicted[r.req_id] = step
            tokens, probs = self._top1(states)
            step += 1
        self.positions_run = step
        for r in requests:  # KV written from predicted states: the next catch-up rewrites it
            if r.req_id in predicted:
                at = position[r.req_id]
                self._kv_tokens[position_slots(r.block_ids, self.block_size, at + 1, at + 1 + predicted[r.req_id])] = -1
        return {req_id: chances.proposal(req_id, tokens, alternatives.get(req_id))
                for req_id, tokens in drafts.items()}

    def finish(self, req_id: str, output_token_ids: list[int] | None) -> None:
        # Its states and head KV stay in its blocks (a prefix hit catches up from them); a
        # preempted request may come back in other blocks.
        self._valid_through.pop(req_id, None)


def _tokens(prompt: list[int], output: list[int], start: int, end: int) -> np.ndarray:  # [end - start] int64
    num_prompt = len(prompt)
    if end <= num_prompt:
        return np.asarray(prompt[start:end], dtype=np.int64)
    if start >= num_prompt:
        return np.asarray(output[start - num_prompt: end - num_prompt], dtype=np.int64)
    return np.asarray(prompt[start:] + output[: end - num_prompt], dtype=np.int64)
