"""Draft-model proposer: a small causal LM with the target's tokenizer drafts k tokens greedily.

Its KV cache is a pool of its own, indexed by the same block ids as the target's, so prefix
caching, preemption and freeing cover both: every step it runs over exactly the tokens the
target ran (same positions, same slots), so any block the target holds or caches is valid for
the draft too. Then, for each request that decodes next, it runs k one-token steps from the
token just sampled; those writes land in lookahead slots the scheduler reserved.

Drafts are greedy (argmax of the draft), so the rejection sampler treats them as one-hot
proposals: exact for greedy targets and lossless for sampled ones.

A draft folder may borrow the target's embedding (config.json: "draftgate": {"shared_embedding":
true}) and restrict its output to a reduced vocabulary (draft_vocab.safetensors: "draft_vocab_ids",
sorted target token ids), so the shipped draft is a few transformer layers and nothing else.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

import torch
from safetensors.torch import load_file

from engine.model.arch_config import ArchConfig
from engine.model.attention_metadata import AttentionMetadata
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import load_model
from engine.model.loader.hf_loader import load_hf_model
from engine.model.quantization import prepare_draft_layers, prepare_for_inference
from engine.config import SpeculativeConfig
from engine.model.resolve import EMBEDDED_MODEL_NAME, ResolvedModel, resolve_model
from engine.spec_decode.proposer import Proposal, ProposalRequest
from engine.worker.kv_cache import KVCacheSpec, allocate_kv_caches
from kernels.onednn_linear import onednn_linear, prepack_bf16

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
    # head_weight prepacked for oneDNN (bf16 on CPUs with AMX / AVX512-BF16), else None.
    head_packed: torch.Tensor | None = None


# The draft shipped for the embedded model (trained by drafts/, stored in the repository).
SHIPPED_DRAFT_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "drafts", "smollm2-135m-draft")


def resolve_draft_path(config: SpeculativeConfig, target: ResolvedModel) -> str:
    """The draft to load: the configured one, else the shipped draft of the embedded model."""
    if config.draft_model is not None:
        return config.draft_model
    if target.name == EMBEDDED_MODEL_NAME and os.path.isfile(os.path.join(SHIPPED_DRAFT_DIR, "config.json")):
        return os.path.abspath(SHIPPED_DRAFT_DIR)
    raise ValueError(
        f"speculative {config.method!r} needs a draft model: pass draft=/path/to/draft (a GGUF file or "
        f"a draft folder); only the embedded model has a shipped default"
    )


def load_draft_model(path: str, target: LlamaForCausalLM, target_arch: ArchConfig, dtype: torch.dtype,
                     device: torch.device) -> DraftModel:
    resolved = resolve_model(path)
    if resolved.format == "gguf":
        model, arch = load_model(resolved, dtype=dtype, device=device, progress=False, inference_only=True)
        _check_vocab(arch, target_arch, path)
        return DraftModel(model, arch, None, None)
    with open(os.path.join(resolved.path, "config.json"), encoding="utf-8") as f:
        extra = json.load(f).get("draftgate") or {}
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
    # decoder linears and the reduced head are prepacked like the target's (bf16 on AMX CPUs).
    head_packed = None
    if prepare_draft_layers(model, device) and head_weight is not None:
        head_packed = prepack_bf16(head_weight)
    elif head_weight is None:
        prepare_for_inference(model, None, device)
    return DraftModel(model, arch, head_weight, vocab_ids, head_packed)


def _check_vocab(arch: ArchConfig, target_arch: ArchConfig, path: str) -> None:
    if arch.vocab_size != target_arch.vocab_size:
        raise ValueError(f"draft {path!r} has a vocabulary of {arch.vocab_size} tokens, the target "
                         f"{target_arch.vocab_size}: a draft must share its target's tokenizer")


class DraftModelProposer:
    def __init__(self, draft: DraftModel, *, num_blocks: int, block_size: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.draft = draft
        self.block_size = block_size
        self.device = device
        self.kv_spec = KVCacheSpec(draft.arch.num_hidden_layers, draft.arch.num_key_value_heads,
                                   draft.arch.head_dim, block_size, dtype)
        self.kv_caches = allocate_kv_caches(self.kv_spec, num_blocks, device)

    @staticmethod
    def kv_bytes_per_block(arch: ArchConfig, block_size: int, dtype: torch.dtype) -> int:
        return KVCacheSpec(arch.num_hidden_layers, arch.num_key_value_heads, arch.head_dim, block_size,
                           dtype).bytes_per_block

    @torch.inference_mode()
    def observe_step(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata) -> None:
        """Writes the draft's KV for every token the target ran this step (the same slots)."""
        self.draft.model(input_ids, positions, self.kv_caches, meta)

    @torch.inference_mode()
    def propose(self, requests: list[ProposalRequest]) -> dict[str, Proposal]:
        drafts: dict[str, list[int]] = {r.req_id: [] for r in requests}
        # Each request drafts from the token it just sampled, at the position after its context.
        current = {r.req_id: r.output_token_ids[-1] for r in requests}
        position = {r.req_id: len(r.prompt_token_ids) + len(r.output_token_ids) - 1 for r in requests}
        # Never write past the blocks the request owns (lookahead is trimmed near the context end).
        limit = {r.req_id: min(r.num_drafts, len(r.block_ids) * self.block_size - position[r.req_id])
                 for r in requests}
        by_id = {r.req_id: r for r in requests}
        step = 0
        while True:
            active = [r for r in requests if limit[r.req_id] > step]
            if not active:
                break
            ids = [r.req_id for r in active]
            input_ids = torch.tensor([current[i] for i in ids], dtype=torch.int64, device=self.device)
            positions = torch.tensor([position[i] for i in ids], dtype=torch.int64, device=self.device)
            meta = AttentionMetadata.build(
                query_lens=[1] * len(ids), seq_lens=[position[i] + 1 for i in ids],
                block_ids=[by_id[i].block_ids for i in ids], block_size=self.block_size, device=self.device,
            )
            hidden = self.draft.model(input_ids, positions, self.kv_caches, meta)  # [n, hidden]
            next_ids = self._greedy(hidden).tolist()
            for req_id, token in zip(ids, next_ids):
                drafts[req_id].append(token)
                current[req_id] = token
                position[req_id] += 1
            step += 1
        return {req_id: Proposal(tokens) for req_id, tokens in drafts.items()}

    def _greedy(self, hidden: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [n] target token ids
        if self.draft.head_weight is None:
            return self.draft.model.compute_logits(hidden).argmax(dim=-1)
        if self.draft.head_packed is not None:
            rows = onednn_linear(hidden, self.draft.head_packed).argmax(dim=-1)
        else:
            rows = torch.nn.functional.linear(hidden, self.draft.head_weight).argmax(dim=-1)
        assert self.draft.vocab_ids is not None
        return self.draft.vocab_ids.index_select(0, rows)

    def finish(self, req_id: str, output_token_ids: list[int] | None) -> None:
        pass  # the KV lives in the shared block pool; nothing per request to drop
