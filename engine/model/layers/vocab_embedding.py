"""Token embedding and the lm_head that maps hidden states back to vocabulary logits."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kernels import small_rows_linear


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype, device=device),
                                   requires_grad=False)  # [vocab_size, hidden_size]

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:  # [num_tokens] -> [num_tokens, hidden]
        return F.embedding(token_ids, self.weight)


class LMHead(nn.Module):
    """Logits in float32, whatever the model dtype: samplers and rejection tests compare
    probabilities that bf16 would round together. With tied embeddings the weight is the
    embedding's own Parameter (shared storage, loaded once)."""

    def __init__(self, vocab_size: int, hidden_size: int, *, tied_to: VocabEmbedding | None,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        if tied_to is not None:
            self.weight = tied_to.weight  # [vocab_size, hidden_size]
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype, device=device),
                                       requires_grad=False)  # [vocab_size, hidden_size]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # [num_rows, hidden] -> [num_rows, vocab] fp32
        return small_rows_linear.linear(hidden, self.weight).float()
