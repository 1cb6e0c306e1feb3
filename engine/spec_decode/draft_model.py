"""Draft-model proposer: a small causal LM with the target's tokenizer drafts k tokens greedily.

Its KV cache is a pool of its own, indexed by the same block ids and slots as the target's, so
prefix caching, preemption and freeing cover both. It is filled lazily: the draft runs only for
the requests it drafts for, and then first catches up on the context tokens it has no KV for
(in the same forward as its first draft step, one chunk per request). A request the controller
has switched off therefore costs no draft compute at all; when it is switched back on, the
tokens it missed cost one chunked forward, cheaper than the per-step forwards it skipped.

Which slots hold valid draft KV is tracked per slot: _kv_tokens[slot] is the token the draft
wrote there, -1 for none. A request's draft KV at positions 0..p is valid exactly when the
slots of those positions (through its block table) hold its tokens 0..p: every write is made
over a context that held the tokens recorded before it, so matching records mean matching
contexts. Three rules keep that true: a freshly allocated block forgets its records (its old
contents belong to another context, forget_blocks); a cached block keeps them (a prefix hit
shares its whole prefix, so the draft KV a finished request left is reused); and after writing
a request's positions up to p the draft forgets its records past p in that request's blocks
(stale drafts written over an older context must not match later by coincidence). Drafted
tokens the target accepts are thereby already valid; rejected ones stop the match.

Drafts are greedy (argmax of the draft), so the rejection sampler treats them as one-hot
proposals: exact for greedy targets and lossless for sampled ones. Each draft carries the
draft's probability of it, and a request's drafts stop where the calibrated chance that all
survive falls below its min_confidence (engine/spec_decode/calibration.py; the first draft is
always kept). The draft only ever writes its own pool, so nothing it does can change the
target's output.

A draft folder may borrow the target's embedding (config.json: "draftgate": {"shared_embedding":
true}) and restrict its output to a reduced vocabulary (draft_vocab.safetensors: "draft_vocab_ids",
sorted target token ids), so the shipped draft is a few transformer layers and nothing else.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import numpy as np

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from engine.model.arch_config import ArchConfig
from engine.model.attention_metadata import AttentionMetadata
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import load_model
from engine.model.loader.hf_loader import load_hf_model
from engine.model.quantization import prepare_draft_layers, prepare_for_inference
from engine.config import SpeculativeConfig
from engine.model.resolve import ResolvedModel, resolve_model, shipped_draft_path
from engine.spec_decode.calibration import ConfidenceCalibration, DraftChances
from engine.spec_decode.proposer import Proposal, ProposalRequest
from engine.worker.kv_cache import KVCacheSpec, allocate_kv_caches
from kernels import small_rows_linear
from kernels.onednn_linear import prepack
from kernels.quant_ref import quantize_int8

logger = logging.getLogger(__name__)

DRAFT_VOCAB_FILE = "draft_vocab.safetensors"


@dataclass
class DraftModel:
    model: LlamaForCausalLM
    arch: ArchConfig
    # The output head: [output_vocab, hidden] and, for a reduced vocabulary, the target token id
    # of each output row ([output_vocab] int64); None: the model's own head over the full vocabulary.
    head_weight: torch.Tensor | None
    vocab_ids: torch.Tensor | None
    # head_weight prepacked for oneDNN (on CPUs: float32, or bf16 with AMX / AVX512-BF16), else None.
    head_packed: torch.Tensor | None = None
    # An EAGLE head (engine/spec_decode/eagle.py): [hidden, 2 * hidden], the projection of
    # [embedding; target state] into its layer. None: a standalone draft model.
    fc_weight: torch.Tensor | None = None
    fc_packed: torch.Tensor | None = None  # fc_weight prepacked for oneDNN, like head_packed
    # float32 arithmetic over weights held in "bf16" or "int8" (load_draft_model's held, applied);
    # None: the dtype's own weights
    held: str | None = None
    # int8-held: head_weight's and fc_weight's scales, [output_vocab] and [hidden] float32
    head_scales: torch.Tensor | None = None
    fc_scales: torch.Tensor | None = None

    def fc(self, joined: torch.Tensor) -> torch.Tensor:  # [n, 2 * hidden] -> [n, hidden]
        """An EAGLE head's projection of [embedding; target state] into its layer."""
        assert self.fc_weight is not None
        return _held_linear(joined, self.fc_weight, self.fc_scales, self.fc_packed)


def _held_linear(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor | None,
                 packed: torch.Tensor | None) -> torch.Tensor:  # [n, K] -> [n, N]
    if scales is not None:
        return small_rows_linear.linear_int8(x, weight, scales)
    return small_rows_linear.linear(x, weight, onednn_weight=packed)


def resolve_draft_path(config: SpeculativeConfig, target: ResolvedModel) -> str:
    """The draft to load: the configured one, else the shipped draft of the embedded model."""
    if config.draft_model is not None:
        return config.draft_model
    shipped = shipped_draft_path(target)
    if shipped is not None:
        return shipped
    raise ValueError(
        f"speculative {config.method!r} needs a draft model: pass draft=/path/to/draft (a GGUF file or "
        f"a draft folder); only the embedded model has a shipped default"
    )


def load_draft_model(path: str, target: LlamaForCausalLM, target_arch: ArchConfig, dtype: torch.dtype,
                     device: torch.device, *, inference_only: bool = True, held: str | None = None) -> DraftModel:
    """inference_only: its linears in their fastest execution form (prepacked for oneDNN on a
    CPU), which exposes no `.weight`; False keeps plain weights for code that reads them
    (drafts/: continuing an exported head). held "bf16" or "int8" (with inference_only, a float32
    dtype and a reduced vocabulary or an EAGLE head): the decoder linears, the fc and the reduced
    output head hold their weights so (int8: one float32 scale per row) and compute in float32
    (engine/worker/model_runner.py's draft_weight_format)."""
    if held not in (None, "bf16", "int8"):
        raise ValueError(f"held weights must be None, 'bf16' or 'int8', got {held!r}")
    resolved = resolve_model(path)
    if resolved.format == "gguf":
        model, arch = load_model(resolved, dtype=dtype, device=device, progress=False, inference_only=inference_only)
        _check_vocab(arch, target_arch, path)
        return DraftModel(model, arch, None, None)
    with open(os.path.join(resolved.path, "config.json"), encoding="utf-8") as f:
        extra = json.load(f).get("draftgate") or {}
    kind = extra.get("kind", "layers")
    if kind not in ("layers", "eagle"):
        raise ValueError(f"draft {path!r}: unknown draftgate kind {kind!r} (expected 'layers' or 'eagle')")
    provided = {}
    if extra.get("shared_embedding"):
        provided["model.embed_tokens.weight"] = target.embed_tokens.weight
        if not target_arch.tie_word_embeddings:
            # An untied target's output head is its lm_head, not its embedding.
            head = getattr(target.lm_head, "weight", None)
            if head is None:
                raise ValueError(f"draft {path!r} shares the output head of the target, whose head is quantized "
                                 f"here: serve the target unquantized, or use a draft with its own head")
            provided["lm_head.weight"] = head
        # A draft in another dtype than its target's (bf16 under a float32 target) keeps a
        # converted copy; in the same dtype it shares the storage.
        provided = {name: tensor.to(dtype) for name, tensor in provided.items()}
    model, arch = load_hf_model(resolved.path, dtype, device, progress=False, provided=provided)
    _check_vocab(arch, target_arch, path)
    head_weight = vocab_ids = None
    vocab_file = os.path.join(resolved.path, DRAFT_VOCAB_FILE)
    if os.path.isfile(vocab_file):
        vocab_ids = load_file(vocab_file)["draft_vocab_ids"].to(device=device, dtype=torch.int64)
        if vocab_ids.numel() == 0 or int(vocab_ids.max()) >= target_arch.vocab_size:
            raise ValueError(f"{vocab_file}: draft_vocab_ids must be non-empty target token ids")
        head_weight = model.lm_head.weight.index_select(0, vocab_ids)  # [output_vocab, hidden]
    # Drafting is k tiny forwards per step, so per-call weight reordering would dominate: the
    # decoder linears and the reduced head are prepacked like the target's (oneDNN on CPUs).
    fc_weight = None
    if kind == "eagle":
        if not extra.get("shared_embedding"):
            raise ValueError(f"draft {path!r}: an EAGLE head shares its target's embedding and head")
        if arch.num_hidden_layers != 1 or arch.hidden_size != target_arch.hidden_size:
            raise ValueError(f"draft {path!r}: an EAGLE head has one layer of the target's hidden size")
        # (load_hf_model skipped fc.weight, which a llama model has no place for: read it alone.)
        with safe_open(os.path.join(resolved.path, "model.safetensors"), framework="pt") as f:
            fc_weight = f.get_tensor("fc.weight").to(device=device, dtype=dtype)
        if tuple(fc_weight.shape) != (arch.hidden_size, 2 * arch.hidden_size):
            raise ValueError(f"draft {path!r}: fc.weight is {tuple(fc_weight.shape)}, expected "
                             f"({arch.hidden_size}, {2 * arch.hidden_size})")
    if inference_only and kind == "eagle":
        # Most of an EAGLE head's positions only write KV (eagle.py): a k/v projection of its own.
        model.layers[0].self_attn.add_kv_projection()
    head_packed = fc_packed = head_scales = fc_scales = None
    applied = None
    if inference_only and head_weight is None and kind == "layers":
        prepare_for_inference(model, None, device)  # its decoder and its full-vocabulary head
    elif inference_only and held is not None and dtype == torch.float32:
        if prepare_draft_layers(model, device, held=held):
            applied = held
        # (The reduced head's rows are a copy: the target's own head keeps its float32 weight.)
        if held == "bf16":
            head_weight = head_weight.bfloat16() if head_weight is not None else None
            fc_weight = fc_weight.bfloat16() if fc_weight is not None else None
        else:
            if head_weight is not None:
                head_weight, head_scales = quantize_int8(head_weight)
            if fc_weight is not None:
                fc_weight, fc_scales = quantize_int8(fc_weight)
    elif inference_only and prepare_draft_layers(model, device):
        if head_weight is not None:
            head_packed = prepack(head_weight)
        if fc_weight is not None:
            fc_packed = prepack(fc_weight)
    return DraftModel(model, arch, head_weight, vocab_ids, head_packed, fc_weight, fc_packed, applied,
                      head_scales, fc_scales)


def position_slots(block_ids: list[int], block_size: int, start: int, end: int) -> np.ndarray:
    """The slots of positions [start, end) of a request whose block table is block_ids: [end - start] int64."""
    positions = np.arange(start, end, dtype=np.int64)
    blocks = np.asarray(block_ids, dtype=np.int64)[positions // block_size]
    return blocks * block_size + positions % block_size


def block_slots(block_ids: list[int], block_size: int) -> np.ndarray:
    """Every slot of the blocks: [len(block_ids) * block_size] int64."""
    return (np.asarray(block_ids, dtype=np.int64)[:, None] * block_size + np.arange(block_size)).reshape(-1)


def _check_vocab(arch: ArchConfig, target_arch: ArchConfig, path: str) -> None:
    if arch.vocab_size != target_arch.vocab_size:
        raise ValueError(f"draft {path!r} has a vocabulary of {arch.vocab_size} tokens, the target "
                         f"{target_arch.vocab_size}: a draft must share its target's tokenizer")


class DraftModelProposer:
    supports_confidence = True  # stops a request's drafts by ProposalRequest.min_confidence

    def __init__(self, draft: DraftModel, *, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.draft = draft
        self.block_size = block_size
        self.device = device
        self.kv_spec = KVCacheSpec(draft.arch.num_hidden_layers, draft.arch.num_key_value_heads,
                                   draft.arch.head_dim, block_size, dtype)
        self.kv_caches = allocate_kv_caches(self.kv_spec, num_blocks, device)
        # [num_blocks * block_size] int64: the token whose draft KV each slot holds, -1: none.
        self._kv_tokens = np.full(num_blocks * block_size, -1, dtype=np.int64)
        self.num_catch_up_tokens = 0  # context tokens run to catch up (tests and diagnostics)
        # Positions the last propose drafted in sequence (the deepest request's; a draft computed
        # and then dropped for its confidence counts: its pass ran). The controller prices by it.
        self.positions_run = 0
        # Set by the controller (the chance a draft is accepted, given its probability; None:
        # the probability itself).
        self.calibration: ConfidenceCalibration | None = None

    @staticmethod
    def kv_bytes_per_block(draft: DraftModel, block_size: int, dtype: torch.dtype) -> int:
        arch = draft.arch
        return KVCacheSpec(arch.num_hidden_layers, arch.num_key_value_heads, arch.head_dim, block_size,
                           dtype).bytes_per_block

    def forget_blocks(self, block_ids: list[int]) -> None:
        """Blocks just allocated afresh: whatever draft KV they hold belongs to another context."""
        self._kv_tokens[block_slots(block_ids, self.block_size)] = -1

    def _first_stale(self, request: ProposalRequest, context: np.ndarray) -> int:
        """The first position (< len(context)) whose draft KV is not valid for this request."""
        recorded = self._kv_tokens[position_slots(request.block_ids, self.block_size, 0, len(context))]
        mismatch = np.flatnonzero(recorded != context)
        return int(mismatch[0]) if mismatch.size else len(context)

    @torch.inference_mode()
    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
        drafts: dict[str, list[int]] = {r.req_id: [] for r in requests}
        # Each request drafts from the token it just sampled, at the position after its context.
        position = {r.req_id: len(r.prompt_token_ids) + len(r.output_token_ids) - 1 for r in requests}
        # Never write past the blocks the request owns (lookahead is trimmed near the context end).
        limit = {r.req_id: min(r.num_drafts, len(r.block_ids) * self.block_size - position[r.req_id])
                 for r in requests}
        active = [r for r in requests if limit[r.req_id] > 0]
        self.positions_run = 0
        if not active:
            return {req_id: Proposal(tokens) for req_id, tokens in drafts.items()}
        # First step: per request, the context it has no draft KV for, ending with the token just
        # sampled (a 1-token chunk in the steady state, where the accepted drafts are already valid).
        chunks, starts = [], []
        for r in active:
            context = np.asarray(r.prompt_token_ids + r.output_token_ids, dtype=np.int64)  # [L]
            start = self._first_stale(r, context[:-1])
            chunks.append(context[start:])
            starts.append(start)
            self.num_catch_up_tokens += len(context) - 1 - start
        query_lens = [len(c) for c in chunks]
        input_ids = torch.from_numpy(np.concatenate(chunks)).to(self.device)  # [sum(query_lens)]
        positions = torch.from_numpy(np.concatenate(
            [np.arange(s, s + n, dtype=np.int64) for s, n in zip(starts, query_lens)])).to(self.device)
        seq_lens = [s + n for s, n in zip(starts, query_lens)]
        hidden = self._forward(input_ids, positions, active, query_lens, seq_lens)  # [sum(query_lens), hidden]
        last_rows = torch.tensor(np.cumsum(query_lens) - 1, device=self.device)
        next_ids, next_probs = self._greedy(hidden.index_select(0, last_rows))
        for r, start, chunk in zip(active, starts, chunks):
            self._kv_tokens[position_slots(r.block_ids, self.block_size, start, start + len(chunk))] = chunk
        current = {}
        # Confidence (calibration.py): a request's drafts stop where the chance that all survive
        # falls below its min_confidence (its first is always kept), and another position runs
        # only while the draft expected there could pay.
        chances = DraftChances(self.calibration, [r.req_id for r in active])
        for r, token, prob in zip(active, next_ids, next_probs):
            chances.keep(r, prob)
            drafts[r.req_id].append(token)
            current[r.req_id] = token
            position[r.req_id] += 1
        # Then one token per step from the last draft, while a request wants more.
        stopped: set[str] = set()
        step = 1
        while True:
            active = [r for r in active if limit[r.req_id] > step and r.req_id not in stopped
                      and chances.worth_another(r)]
            if not active:
                break
            ids = [r.req_id for r in active]
            input_ids = torch.tensor([current[i] for i in ids], dtype=torch.int64, device=self.device)
            positions = torch.tensor([position[i] for i in ids], dtype=torch.int64, device=self.device)
            hidden = self._forward(input_ids, positions, active, [1] * len(ids),
                                   [position[i] + 1 for i in ids])  # [n, hidden]
            for r in active:
                at = position[r.req_id]
                self._kv_tokens[position_slots(r.block_ids, self.block_size, at, at + 1)] = current[r.req_id]
            tokens, probs = self._greedy(hidden)
            for r, token, prob in zip(active, tokens, probs):
                position[r.req_id] += 1  # the KV of the draft fed back is written either way
                if not chances.keep(r, prob):
                    stopped.add(r.req_id)
                    continue
                drafts[r.req_id].append(token)
                current[r.req_id] = token
            step += 1
        for r in requests:
            # Past the last position written (the last draft was never fed back), its records are
            # from older drafts over an older context: forget them.
            written = position[r.req_id] - 1 if drafts[r.req_id] else position[r.req_id]
            end = len(r.block_ids) * self.block_size
            if written + 1 < end:
                self._kv_tokens[position_slots(r.block_ids, self.block_size, written + 1, end)] = -1
        self.positions_run = step
        return {req_id: chances.proposal(req_id, tokens) for req_id, tokens in drafts.items()}

    def _forward(self, input_ids: torch.Tensor, positions: torch.Tensor, requests: list[ProposalRequest],
                 query_lens: list[int], seq_lens: list[int]) -> torch.Tensor:
        """The draft over the last query_lens[i] of each request's first seq_lens[i] tokens."""
        meta = AttentionMetadata.build(query_lens=query_lens, seq_lens=seq_lens,
                                       block_ids=[r.block_ids for r in requests], block_size=self.block_size,
                                       device=self.device)
        return self.draft.model(input_ids, positions, self.kv_caches, meta)

    def _greedy(self, hidden: torch.Tensor) -> tuple[list[int], list[float]]:
        """[n, hidden] -> (n target token ids, the draft's probability of each)."""
        top, best_prob = top_draft_tokens_with_prob(self.draft, hidden, 1)
        return top[:, 0].tolist(), best_prob.tolist()

    def finish(self, req_id: str, output_token_ids: list[int] | None) -> None:
        pass  # the KV lives in the shared block pool; nothing per request to drop


def top_draft_tokens(draft: DraftModel, hidden: torch.Tensor, k: int) -> torch.Tensor:
    """[n, hidden] -> [n, k] target token ids: the draft head's k most likely, best first."""
    return _top(draft, _draft_logits(draft, hidden), k)


def top_draft_tokens_with_prob(draft: DraftModel, hidden: torch.Tensor,
                               k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, hidden] -> ([n, k] target token ids as top_draft_tokens, [n] float32: the draft's
    softmax probability of its best one, over the vocabulary it drafts from)."""
    logits = _draft_logits(draft, hidden).float()  # [n, draft vocab]
    best_prob = torch.softmax(logits, dim=-1).amax(dim=-1)  # [n]
    return _top(draft, logits, k), best_prob


def _draft_logits(draft: DraftModel, hidden: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n, draft vocab]
    if draft.head_weight is None:
        return draft.model.compute_logits(hidden)
    return _held_linear(hidden, draft.head_weight, draft.head_scales, draft.head_packed)


def _top(draft: DraftModel, logits: torch.Tensor, k: int) -> torch.Tensor:  # [n, draft vocab] -> [n, k] target ids
    rows = logits.argmax(dim=-1, keepdim=True) if k == 1 else logits.topk(k, dim=-1).indices  # [n, k]
    if draft.head_weight is None:
        return rows
    assert draft.vocab_ids is not None
    return draft.vocab_ids[rows]
