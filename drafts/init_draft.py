"""Initialising a draft: from chosen target layers, or from another checkpoint (e.g. Qwen3-0.6B).

A draft built from target layers 0, mid and last already computes something close to the
target's residual stream (the first layer's features, the last layer's read-out), so
distillation starts from a far better point than random init and converges in the few
thousand steps a CPU affords.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.llama import LlamaForCausalLM

from drafts.model import TrainableLlama
from drafts.target import Target, draft_arch, set_parameter


@dataclass(frozen=True)
class DraftInit:
    """How to build the draft.

    layer_ids: target layers to copy, in order (from_target); None with from_checkpoint: all of
    the checkpoint's layers. shared_embedding: the draft borrows the target's frozen embedding
    and output head (requires the same hidden size). vocab_ids: sorted target ids of a reduced
    output vocabulary, or None for all of them.
    """

    layer_ids: tuple[int, ...] | None
    shared_embedding: bool
    vocab_ids: torch.Tensor | None = None  # [num_draft_vocab] int64

    def __post_init__(self) -> None:
        if self.layer_ids is not None and not self.layer_ids:
            raise ValueError("layers must name at least one layer")


def spread_layers(num_target_layers: int, num_layers: int) -> tuple[int, ...]:
    """num_layers layer ids spread evenly over the target, always the first and the last."""
    if not 1 <= num_layers <= num_target_layers:
        raise ValueError(f"num_layers must be in 1..{num_target_layers}, got {num_layers}")
    if num_layers == 1:
        return (num_target_layers - 1,)
    step = (num_target_layers - 1) / (num_layers - 1)
    return tuple(round(i * step) for i in range(num_layers))


def parse_layer_ids(text: str, num_target_layers: int) -> tuple[int, ...]:
    """"0,15,29" -> (0, 15, 29); "3" -> 3 layers spread over the target; "-1" is the last."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if len(parts) == 1 and not parts[0].startswith("-"):
        return spread_layers(num_target_layers, int(parts[0]))
    ids = []
    for part in parts:
        index = int(part)
        if index < 0:
            index += num_target_layers
        if not 0 <= index < num_target_layers:
            raise ValueError(f"layers: {part} is not a layer of the target (0..{num_target_layers - 1})")
        ids.append(index)
    return tuple(ids)


def init_from_target(target: Target, init: DraftInit,
                     model_class: type[TrainableLlama] = TrainableLlama) -> TrainableLlama:
    """A trainable draft on the target's device, float32 master weights, layers copied
    (model_class: TrainableLlama, or a subclass such as drafts.eagle.TrainableEagle)."""
    assert init.layer_ids is not None
    return _init_from_model(target.engine_model, target, init, list(init.layer_ids), model_class)


def init_from_checkpoint(source: LlamaForCausalLM, target: Target, init: DraftInit) -> TrainableLlama:
    """A draft from another model with the target's tokenizer (e.g. Qwen3-0.6B for Qwen3-32B)."""
    if source.arch.vocab_size != target.arch.vocab_size:
        raise ValueError(f"init checkpoint has a vocabulary of {source.arch.vocab_size} tokens, the target "
                         f"{target.arch.vocab_size}: a draft must share its target's tokenizer")
    layer_ids = list(init.layer_ids) if init.layer_ids is not None else list(range(source.arch.num_hidden_layers))
    return _init_from_model(source, target, init, layer_ids)


def _init_from_model(source: LlamaForCausalLM, target: Target, init: DraftInit, layer_ids: list[int],
                     model_class: type[TrainableLlama] = TrainableLlama) -> TrainableLlama:
    if init.shared_embedding and source.arch.hidden_size != target.arch.hidden_size:
        raise ValueError(f"shared_embedding needs the draft's hidden_size ({source.arch.hidden_size}) to equal "
                         f"the target's ({target.arch.hidden_size})")
    for index in layer_ids:
        if not 0 <= index < source.arch.num_hidden_layers:
            raise ValueError(f"layers: {index} is not a layer of the source model")
    device = target.device
    arch = draft_arch(source.arch, len(layer_ids), layer_ids)
    draft = model_class(arch, vocab_ids=init.vocab_ids, dtype=torch.float32, device=device)
    source_params = dict(source.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for new_index, old_index in enumerate(layer_ids):
            for name, param in draft.layers[new_index].named_parameters():
                param.copy_(source_params[f"layers.{old_index}.{name}"])
        draft.norm.weight.copy_(source.norm.weight)
        _init_embedding_and_head(draft, source, target, init)
    return draft


def _init_embedding_and_head(draft: TrainableLlama, source: LlamaForCausalLM, target: Target,
                             init: DraftInit) -> None:
    vocab_ids = init.vocab_ids
    if init.shared_embedding:
        # The target's own tensors, frozen: nothing of them is stored with the draft.
        embed = target.engine_model.embed_tokens.weight
        head = target.engine_model.lm_head.weight
        set_parameter(draft, "embed_tokens.weight", embed)
        if vocab_ids is None:
            set_parameter(draft, "lm_head.weight", head)
        else:
            rows = head.index_select(0, vocab_ids.to(head.device)).float()  # [num_draft_vocab, hidden]
            set_parameter(draft, "lm_head.weight", rows)
        for param in (draft.embed_tokens.weight, draft.lm_head.weight):
            param.requires_grad_(False)
        return
    draft.embed_tokens.weight.copy_(source.embed_tokens.weight)
    head = source.lm_head.weight
    draft.lm_head.weight.copy_(head if vocab_ids is None else head.index_select(0, vocab_ids.to(head.device)))
