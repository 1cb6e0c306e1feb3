"""The sampler: one token per row from a batch of logits.

Order of operations (every step is skipped when no row in the batch needs it):
1. logit_bias, then the min_tokens mask (-inf on EOS and stop ids), then penalties, then the
   grammar's token bitmask (constrained decoding: -inf on every token the grammar forbids);
2. logprobs, if any row asked, from the log-softmax of these processed logits (see logprobs.py);
3. greedy rows take the argmax of the processed logits, exactly;
4. random rows: temperature, min-p, top-k, top-p (each keeps at least the most likely token),
   then the exponential race: argmax(probs / E) with E ~ Exp(1) i.i.d. per token, which picks
   token i with probability probs[i] and needs no multinomial (no host sync). Seeded rows draw E
   from their own generator, so a seeded request's tokens do not depend on the rest of the batch.

Truncations are thresholds on the logit value (keep every token >= the row's cutoff), so tied
tokens at a boundary are all kept and the two top-p strategies below choose the same set.
The sampler works in place on the logits it is given (the caller hands them over).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sample.logprobs import LogprobsTensors
from engine.sample.penalties import apply_penalties
from engine.sample.sampling_metadata import SamplingMetadata

# On CPU a full sort of one 49k-token row costs ~4 ms, the whole decode step of a small model
# costs ~20 ms, while topk(1024) costs ~0.5 ms. So top-p looks at this many candidates first and
# sorts fully only the rows whose nucleus does not fit (a host-side check, free on CPU).
DEFAULT_TOP_P_CANDIDATES = 1024

# The smallest positive normal float32: keeps the Exp(1) noise in (0, 87.4] so probs / noise is
# finite and a zero-probability token (probs == 0) can never win the race.
_TINY = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [num_reqs] int64
    logprobs: LogprobsTensors | None  # None when no row asked for logprobs


class Sampler:
    """Samples one token per row; see the module docstring for the exact order of operations.

    top_p_candidates: on CPU, how many top tokens top-p examines before falling back to a full
    sort (None: always sort). On other devices top-p always sorts, which is sync-free.
    """

    def __init__(self, top_p_candidates: int | None = DEFAULT_TOP_P_CANDIDATES) -> None:
        if top_p_candidates is not None and top_p_candidates < 1:
            raise ValueError(f"top_p_candidates must be >= 1 or None, got {top_p_candidates}")
        self.top_p_candidates = top_p_candidates

    def __call__(
        self,
        logits: torch.Tensor,  # [num_reqs, vocab_size] float32, modified in place
        meta: SamplingMetadata,
    ) -> SamplerOutput:
        if logits.dtype != torch.float32:
            logits = logits.float()
        self.process_logits(logits, meta)
        logprobs = logits.log_softmax(dim=-1) if meta.max_num_logprobs is not None else None
        if meta.all_greedy:
            sampled = logits.argmax(dim=-1)  # [num_reqs]
        else:
            greedy_ids = None if meta.all_random else logits.argmax(dim=-1)  # [num_reqs]
            probs = self.compute_probs(logits, meta)
            random_ids = exponential_race(probs, meta.generators)  # [num_reqs]
            if greedy_ids is None:
                sampled = random_ids
            else:
                assert meta.is_greedy is not None
                sampled = torch.where(meta.is_greedy, greedy_ids, random_ids)
        logprobs_out = None
        if logprobs is not None:
            assert meta.max_num_logprobs is not None
            logprobs_out = LogprobsTensors.compute(logprobs, sampled, meta.max_num_logprobs, meta.num_logprobs)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs_out)

    def process_logits(
        self,
        logits: torch.Tensor,  # [num_reqs, vocab_size] float32, modified in place
        meta: SamplingMetadata,
    ) -> None:
        """logit_bias, the min_tokens mask, penalties and the grammar bitmask: what both greedy
        and random rows see. The bitmask comes last so nothing can lift a forbidden token."""
        if meta.logit_bias is not None:
            meta.logit_bias.apply_(logits)
        if meta.min_tokens_mask is not None:
            meta.min_tokens_mask.apply_(logits)
        if meta.penalties is not None:
            apply_penalties(logits, meta.penalties)
        if meta.token_bitmask is not None:
            apply_token_bitmask_(logits, meta.token_bitmask)

    def compute_probs(
        self,
        logits: torch.Tensor,  # [num_reqs, vocab_size] float32, processed; modified in place
        meta: SamplingMetadata,
    ) -> torch.Tensor:  # [num_reqs, vocab_size] float32
        """The distribution random rows sample from: temperature, min-p, top-k, top-p, softmax.

        Greedy rows pass through untruncated at temperature 1 (their result is discarded).
        """
        assert meta.temperature is not None, "compute_probs needs at least one random row"
        logits.div_(meta.temperature.unsqueeze(1))
        if meta.min_p is not None:
            apply_min_p(logits, meta.min_p)
        if meta.top_k is not None:
            apply_top_k(logits, meta.top_k, meta.max_top_k)
        if meta.top_p is not None:
            candidates = self.top_p_candidates if logits.device.type == "cpu" else None
            apply_top_p(logits, meta.top_p, candidates)
        return logits.softmax(dim=-1)


def apply_token_bitmask_(
    logits: torch.Tensor,  # [num_reqs, vocab_size] float32, modified in place
    bitmask: torch.Tensor,  # [num_reqs, ceil(vocab_size / 32)] int32, bit i of word w = token 32w + i
) -> None:
    """Sets the logit of every token whose bit is 0 to -inf."""
    num_reqs, vocab_size = logits.shape
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)  # [32]
    allowed = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool()  # [num_reqs, num_words, 32]
    allowed = allowed.reshape(num_reqs, -1)[:, :vocab_size]  # [num_reqs, vocab_size]
    logits.masked_fill_(~allowed, float("-inf"))


def apply_min_p(
    logits: torch.Tensor,  # [num_reqs, vocab_size] float32, modified in place
    min_p: torch.Tensor,  # [num_reqs] float32, 0.0 keeps everything
) -> None:
    """Masks tokens whose probability is below min_p times the row's top probability.

    Done on logits: p_i < min_p * p_max  <=>  logit_i - logit_max < log(min_p), which needs no
    softmax; min_p = 0 gives log = -inf and masks nothing.
    """
    max_logits = logits.amax(dim=-1, keepdim=True)  # [num_reqs, 1]
    logits.masked_fill_(logits < max_logits + min_p.log().unsqueeze(1), float("-inf"))


def apply_top_k(
    logits: torch.Tensor,  # [num_reqs, vocab_size] float32, modified in place
    top_k: torch.Tensor,  # [num_reqs] int64, vocab_size keeps everything
    max_top_k: int,  # the largest top_k below vocab_size (host int, sizes the topk call)
) -> None:
    """Keeps each row's top_k highest logits (and any token tied with the k-th)."""
    vocab_size = logits.shape[1]
    top_values = logits.topk(max_top_k, dim=-1).values  # [num_reqs, max_top_k], descending
    cutoff = top_values.gather(1, (top_k.clamp(max=max_top_k) - 1).unsqueeze(1))  # [num_reqs, 1]
    cutoff.masked_fill_((top_k >= vocab_size).unsqueeze(1), float("-inf"))
    logits.masked_fill_(logits < cutoff, float("-inf"))


def apply_top_p(
    logits: torch.Tensor,  # [num_reqs, vocab_size] float32, modified in place
    top_p: torch.Tensor,  # [num_reqs] float32 in (0, 1], 1.0 keeps everything
    num_candidates: int | None,
) -> None:
    """Keeps each row's nucleus: the most likely tokens, in order, until their probability mass
    reaches top_p (the token that crosses top_p is kept, so at least one token always is).

    num_candidates None sorts every row (sync-free). An int first takes the top num_candidates
    tokens and sorts fully only the rows whose nucleus is not inside them; that check reads a
    flag back to the host. Both give the same cutoffs: the cumulative sums over a shared sorted
    prefix are the same numbers.
    """
    vocab_size = logits.shape[1]
    log_norm = logits.logsumexp(dim=-1, keepdim=True)  # [num_reqs, 1]
    if num_candidates is None or num_candidates >= vocab_size:
        sorted_logits = logits.sort(dim=-1, descending=True).values
        cutoff, _ = _nucleus_cutoff(sorted_logits, log_norm, top_p)
    else:
        top_values = logits.topk(num_candidates, dim=-1).values  # [num_reqs, num_candidates], descending
        cutoff, covered = _nucleus_cutoff(top_values, log_norm, top_p)
        if not bool(covered.all()):
            rows = (~covered).nonzero().squeeze(1)  # [num_uncovered]
            sorted_logits = logits.index_select(0, rows).sort(dim=-1, descending=True).values
            cutoff[rows] = _nucleus_cutoff(sorted_logits, log_norm[rows], top_p[rows])[0]
    logits.masked_fill_(logits < cutoff, float("-inf"))


def _nucleus_cutoff(
    sorted_logits: torch.Tensor,  # [num_reqs, num_sorted] float32, descending
    log_norm: torch.Tensor,  # [num_reqs, 1] float32, logsumexp over the whole vocabulary
    top_p: torch.Tensor,  # [num_reqs] float32
) -> tuple[torch.Tensor, torch.Tensor]:  # cutoff [num_reqs, 1] float32, covered [num_reqs] bool
    """The logit of the token that brings the cumulative mass to top_p, and whether that token
    lies within the sorted prefix. Rows with top_p >= 1 get cutoff -inf and count as covered."""
    num_sorted = sorted_logits.shape[1]
    cumulative = (sorted_logits - log_norm).exp().cumsum(dim=-1)  # [num_reqs, num_sorted]
    # Cumulative sums of non-negative terms never decrease, so the number of positions still
    # below top_p is the index of the first position that reaches it.
    first_reaching = (cumulative < top_p.unsqueeze(1)).sum(dim=-1)  # [num_reqs]
    disabled = top_p >= 1.0
    covered = (first_reaching < num_sorted) | disabled
    cutoff = sorted_logits.gather(1, first_reaching.clamp(max=num_sorted - 1).unsqueeze(1))
    cutoff.masked_fill_(disabled.unsqueeze(1), float("-inf"))
    return cutoff, covered


def exponential_race(
    probs: torch.Tensor,  # [num_reqs, vocab_size] float32, each row sums to 1; overwritten
    generators: dict[int, torch.Generator],
) -> torch.Tensor:  # [num_reqs] int64
    """One sample per row: argmax(probs / E), E ~ Exp(1) per token.

    E_i / p_i is exponential with rate p_i, and the smallest of independent exponentials is the
    i-th with probability p_i / sum(p). Rows in `generators` draw their noise from their own
    generator (always a full row, so the draw does not depend on the batch); the others share
    the default generator.
    """
    noise = torch.empty_like(probs)
    if len(generators) < probs.shape[0]:
        noise.uniform_()
    for row, generator in generators.items():
        noise[row].uniform_(generator=generator)
    # E = -log(U). The clamps hold whichever end of [0, 1] a backend's uniform includes.
    noise.clamp_(min=_TINY).log_().neg_().clamp_(min=_TINY)
    return probs.div_(noise).argmax(dim=-1)
