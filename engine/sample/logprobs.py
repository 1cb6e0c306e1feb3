"""Log-probabilities of sampled tokens and of the most likely alternatives.

Which distribution: the log-softmax of the logits *after* logit_bias, the min_tokens mask and the
penalties, but *before* temperature, min-p, top-k and top-p. So the numbers describe the model's
(adjusted) opinion of each token and do not depend on how the caller chose to truncate or flatten
the sampling distribution; a token outside the top-p nucleus still gets a finite logprob. Tokens
blocked by min_tokens get -inf. vLLM's default ("raw" logprobs) differs only in not including the
bias and penalties; the OpenAI API documents neither choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# One row as the torch-free side wants it (engine.protocol.TokenLogprobs):
# (sampled token id, its logprob, [(token id, logprob), ...] most likely first).
RowLogprobs = tuple[int, float, list[tuple[int, float]]]


@dataclass(frozen=True)
class LogprobsTensors:
    sampled_token_ids: torch.Tensor  # [num_reqs] int64
    sampled_logprobs: torch.Tensor  # [num_reqs] float32
    top_token_ids: torch.Tensor  # [num_reqs, max_num_logprobs] int64, most likely first
    top_logprobs: torch.Tensor  # [num_reqs, max_num_logprobs] float32, sorted descending
    # Each row's own request for top logprobs (None: the request asked for none).
    num_logprobs: list[int | None]

    @classmethod
    def compute(
        cls,
        logprobs: torch.Tensor,  # [num_reqs, vocab_size] float32, a log-softmax
        sampled_token_ids: torch.Tensor,  # [num_reqs] int64
        max_num_logprobs: int,
        num_logprobs: Sequence[int | None],
    ) -> LogprobsTensors:
        top_logprobs, top_token_ids = logprobs.topk(min(max_num_logprobs, logprobs.shape[1]), dim=-1)
        return cls(
            sampled_token_ids=sampled_token_ids,
            sampled_logprobs=logprobs.gather(1, sampled_token_ids.unsqueeze(1)).squeeze(1),
            top_token_ids=top_token_ids,
            top_logprobs=top_logprobs,
            num_logprobs=list(num_logprobs),
        )

    def tolists(self) -> list[RowLogprobs | None]:
        """Plain Python values per row (one device-to-host copy per tensor).

        A row's top list is trimmed to the count its request asked for; rows whose request asked
        for no logprobs are None.
        """
        sampled_ids = self.sampled_token_ids.tolist()
        sampled_lps = self.sampled_logprobs.tolist()
        top_ids = self.top_token_ids.tolist()
        top_lps = self.top_logprobs.tolist()
        rows: list[RowLogprobs | None] = []
        for i, count in enumerate(self.num_logprobs):
            if count is None:
                rows.append(None)
                continue
            rows.append((sampled_ids[i], sampled_lps[i], list(zip(top_ids[i][:count], top_lps[i][:count]))))
        return rows
