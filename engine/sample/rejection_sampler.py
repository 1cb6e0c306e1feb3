"""Lossless verification of drafted tokens (speculative decoding).

A request that drafted k tokens d_1..d_k is run by the target over its last real token and the
k drafts, which gives k + 1 target distributions p_1..p_{k+1} (p_j predicts the position of
d_j; p_{k+1} the position after d_k). Each p_j is processed exactly as the plain sampler would
process it at that position: logit bias, min_tokens mask and penalties see the drafts before it
as already generated; then temperature, min-p, top-k, top-p.

- accepted tokens: d_j is accepted with probability min(1, p_j(d_j) / q_j(d_j)), where q_j is
  the distribution the proposer drew d_j from, as long as d_1..d_{j-1} were accepted;
- recovered token: at the first rejection j, one token drawn from the residual
  normalize(max(0, p_j - q_j));
- bonus token: when all k drafts are accepted, one token drawn from p_{k+1}.

Every step emits accepted + 1 tokens, and the emitted sequence is distributed exactly as the
target's own sampling (Leviathan et al. 2023, Chen et al. 2023). Greedy requests take the fast
path: accept while d_j equals the argmax.

Deterministic proposers (suffix matching, greedy drafting) have q_j one-hot at d_j: acceptance
is then p_j(d_j) and the residual is p_j without d_j. That is exactly what sampling x_j from p_j
and accepting while x_j == d_j does (P(x_j = d_j) = p_j(d_j), and an x_j that differs is p_j
conditioned on not being d_j), so one-hot drafts are verified that way: row by row up to the
first mismatch, each sampled as plain decoding would sample it, with the same noise (a seeded
row's noise depends on its seed and output position only, sampling_metadata.position_seed). A
seeded request therefore emits the very tokens it would without drafts, however many drafts it
got: speculation changes its speed, not its text.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sample.logprobs import LogprobsTensors, RowLogprobs
from engine.sample.sampler import Sampler, exponential_race
from engine.sample.sampling_metadata import SamplingMetadata


@dataclass
class VerifyRequest:
    """One request's share of the verification batch."""

    first_row: int  # its first row in the logits; it owns first_row .. first_row + len(drafts)
    draft_token_ids: list[int]  # k >= 0 drafts (k == 0: plain sampling of one token)
    greedy: bool
    # [k, vocab_size] float32: the distributions the drafts were drawn from; None = one-hot at
    # each draft (a deterministic proposer).
    draft_probs: torch.Tensor | None = None


class RejectionSampler:
    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def __call__(
        self,
        logits: torch.Tensor,  # [num_rows, vocab_size] target logits, rows grouped per request
        meta: SamplingMetadata,  # one row per logits row (penalties see earlier drafts as output)
        requests: list[VerifyRequest],
    ) -> tuple[list[list[int]], list[list[RowLogprobs | None]] | None]:
        """Returns each request's emitted tokens (accepted drafts + 1) and, when any row asked for
        logprobs, per request one logprobs entry per emitted token."""
        if logits.dtype != torch.float32:
            logits = logits.float()
        self.sampler.process_logits(logits, meta)
        logprobs = logits.log_softmax(dim=-1) if meta.max_num_logprobs is not None else None
        target_argmax = logits.argmax(dim=-1).tolist()  # [num_rows]
        probs = None if meta.all_greedy else self.sampler.compute_probs(logits, meta)  # [num_rows, vocab]

        emitted: list[list[int]] = []
        coupled: list[int] = []  # random requests with one-hot drafts
        # Residual or bonus rows of requests with drafted distributions, sampled together.
        residual_rows: list[torch.Tensor] = []
        residual_generators: dict[int, torch.Generator] = {}
        residual_owner: list[int] = []
        for index, request in enumerate(requests):
            drafts, row = request.draft_token_ids, request.first_row
            if request.greedy:
                accepted = 0
                while accepted < len(drafts) and drafts[accepted] == target_argmax[row + accepted]:
                    accepted += 1
                emitted.append(drafts[:accepted] + [target_argmax[row + accepted]])
                continue
            assert probs is not None
            if request.draft_probs is None:
                emitted.append([])
                coupled.append(index)
                continue
            accepted, residual = self._accept(probs, request, meta.generators.get(row))
            emitted.append(drafts[:accepted])
            if (generator := meta.generators.get(row + accepted)) is not None:
                residual_generators[len(residual_rows)] = generator
            residual_owner.append(index)
            residual_rows.append(residual)
        if coupled:
            assert probs is not None
            self._sample_coupled(probs, meta, requests, coupled, emitted)
        if residual_rows:
            samples = exponential_race(torch.stack(residual_rows), residual_generators).tolist()
            for index, token in zip(residual_owner, samples):
                emitted[index].append(token)

        if logprobs is None:
            return emitted, None
        rows = [request.first_row + j for request, tokens in zip(requests, emitted) for j in range(len(tokens))]
        flat_tokens = [token for tokens in emitted for token in tokens]
        counts = [meta.num_logprobs[row] for row in rows]
        device = logits.device
        row_index = torch.tensor(rows, device=device)
        entries = LogprobsTensors.compute(
            logprobs.index_select(0, row_index), torch.tensor(flat_tokens, device=device),
            meta.max_num_logprobs, counts,
        ).tolists()
        grouped: list[list[RowLogprobs | None]] = []
        position = 0
        for tokens in emitted:
            grouped.append(entries[position : position + len(tokens)])
            position += len(tokens)
        return emitted, grouped

    @staticmethod
    def _sample_coupled(probs: torch.Tensor, meta: SamplingMetadata, requests: list[VerifyRequest],
                        indices: list[int], emitted: list[list[int]]) -> None:
        """One-hot drafts: position by position, sample the row of every request still accepting
        (as plain decoding samples it, with its row's generator) and keep going while the sample
        is the draft. Only the rows up to each request's first mismatch are sampled."""
        active = list(indices)
        j = 0
        while active:
            rows = [requests[index].first_row + j for index in active]
            generators = {i: g for i, row in enumerate(rows) if (g := meta.generators.get(row)) is not None}
            samples = exponential_race(probs[rows], generators).tolist()  # probs[rows] is a copy
            still = []
            for index, token in zip(active, samples):
                emitted[index].append(token)
                drafts = requests[index].draft_token_ids
                if j < len(drafts) and token == drafts[j]:
                    still.append(index)
            active = still
            j += 1

    @staticmethod
    def _accept(probs: torch.Tensor, request: VerifyRequest,
                generator: torch.Generator | None) -> tuple[int, torch.Tensor]:
        """Drafts drawn from distributions (draft_probs): (number of accepted drafts, the
        distribution of the token that follows them)."""
        drafts, row, k = request.draft_token_ids, request.first_row, len(request.draft_token_ids)
        assert request.draft_probs is not None
        if k == 0:
            return 0, probs[row]
        device = probs.device
        draft_ids = torch.tensor(drafts, device=device)
        p_draft = probs[row : row + k].gather(1, draft_ids.unsqueeze(1)).squeeze(1)  # [k]
        q_draft = request.draft_probs.gather(1, draft_ids.unsqueeze(1)).squeeze(1)
        uniform = torch.rand(k, generator=generator, device=device)
        # u < p/q  <=>  u * q < p (no division; q > 0 for a token the proposer drew).
        accept = (uniform * q_draft < p_draft).tolist()
        accepted = 0
        while accepted < k and accept[accepted]:
            accepted += 1
        if accepted == k:
            return k, probs[row + k]
        p = probs[row + accepted]
        residual = (p - request.draft_probs[accepted]).clamp_(min=0.0)
        total = residual.sum()
        # A residual with no mass means p <= q everywhere, i.e. p == q: rejection had zero
        # probability and only rounding got here; p itself is then the right distribution.
        return accepted, residual / total if float(total) > 0.0 else p
