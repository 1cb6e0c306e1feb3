"""Per-request grammar state in the engine: one llguidance matcher per constrained request.

Each step, for every constrained request that samples in that step, `bitmasks_for` returns the
set of tokens its grammar allows next as a packed bitmask (bit i of word w allows token 32w + i);
the sampler sets every other logit to -inf. When the grammar leaves one choice only (a tool's
name after its first letters, the closing `}\n</tool_call>`), the mask allows that one token and
the model's logits decide nothing. The tokens actually sampled are then fed back with
`accept_tokens`. Preemption by recompute keeps a request's output tokens, so its matcher stays
valid across it.

The llguidance tokenizer (the vocabulary as bytes, ~1 s to build) is made on the first
constrained request, not at engine start. numpy only; no torch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np

from engine.model.tokenizer import Tokenizer

if TYPE_CHECKING:
    from engine.request import Request

logger = logging.getLogger(__name__)


def bitmask_words(vocab_size: int) -> int:
    """int32 words in one row of a token bitmask."""
    return (vocab_size + 31) // 32


class _TokenListAdapter:
    """What llguidance.TokenizerWrapper reads from a tokenizer without a tokenizer.json (tiktoken)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.eos_token_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        self.bos_token_id = tokenizer.bos_token_id
        self.tokens = [self._token_bytes(tokenizer, token_id) for token_id in range(vocab_size)]
        self.special_token_ids = sorted(tokenizer.all_special_ids)
        self._tokenizer = tokenizer

    @staticmethod
    def _token_bytes(tokenizer: Any, token_id: int) -> bytes:
        try:
            return tokenizer.token_bytes(token_id)
        except KeyError:
            return b""  # an unused id between the ranks and the added tokens: never allowed

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer.encode(text)


def build_ll_tokenizer(tokenizer: Tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """The engine tokenizer as llguidance sees it: the model's vocab_size (the bitmask covers
    every logit) and every end-of-generation id as EOS (allowed once the grammar is complete)."""
    eos_token_ids = sorted(tokenizer.eos_token_ids) or None
    backend = getattr(tokenizer, "backend", None)
    if backend is not None:
        return llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab_size, eos_token=eos_token_ids)
    if hasattr(tokenizer, "token_bytes"):
        wrapper = llguidance.TokenizerWrapper(_TokenListAdapter(tokenizer, tokenizer.vocab_size))
        return llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=eos_token_ids)
    raise ValueError(f"constrained decoding does not support the tokenizer {type(tokenizer).__name__}")


class StructuredOutputManager:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._matchers: dict[str, llguidance.LLMatcher] = {}

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is None:
            self._ll_tokenizer = build_ll_tokenizer(self.tokenizer, self.vocab_size)
        return self._ll_tokenizer

    def add_request(self, request_id: str, grammar: str) -> None:
        """Compiles the request's grammar; ValueError naming response_format when it cannot be."""
        matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"response_format: the grammar does not compile: {matcher.get_error()}")
        self._matchers[request_id] = matcher

    def has_request(self, request_id: str) -> bool:
        return request_id in self._matchers

    @property
    def num_requests(self) -> int:
        return len(self._matchers)

    def bitmask(self, request_id: str) -> np.ndarray | None:  # [bitmask_words(vocab_size)] int32
        """The tokens the request's grammar allows next, or None when it is unconstrained (or
        its matcher failed, which is logged and ends the constraint rather than masking every
        token)."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return None
        if matcher.is_error():
            self._drop_failed(request_id, matcher)
            return None
        row = np.empty(bitmask_words(self.vocab_size), dtype=np.int32)
        matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        return row

    def bitmasks_for(self, request_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """Bitmask rows of the constrained requests among `request_ids`."""
        rows: dict[str, np.ndarray] = {}
        for request_id in request_ids:
            row = self.bitmask(request_id)
            if row is not None:
                rows[request_id] = row
        return rows

    def bitmasks_for_step(self, num_scheduled_tokens: Mapping[str, int], requests: Mapping[str, Request],
                          spec_tokens: Mapping[str, Sequence[int]] | None = None) -> dict[str, np.ndarray]:
        """Bitmask rows of the constrained requests that sample in this step: those whose
        scheduled tokens complete their context (a prefill chunk that stops short samples nothing).
        A request verifying drafts d_1..d_k this step (spec_tokens) gets [k + 1, words]: row j is
        the grammar's mask after d_1..d_j, so each verification row is masked exactly as plain
        decoding would mask that position; the others get one row [words]."""
        sampling: list[str] = []
        rows: dict[str, np.ndarray] = {}
        for request_id, num_tokens in num_scheduled_tokens.items():
            if request_id in self._matchers:
                request = requests.get(request_id)
                if request is None:
                    continue
                drafts = (spec_tokens or {}).get(request_id) or ()
                if request.num_computed_tokens + num_tokens - len(drafts) < request.num_tokens:
                    continue
                if drafts:
                    stacked = self._draft_bitmasks(request_id, drafts)
                    if stacked is not None:
                        rows[request_id] = stacked
                else:
                    sampling.append(request_id)
        if sampling:
            rows.update(self.bitmasks_for(sampling))
        return rows

    def _draft_bitmasks(self, request_id: str, drafts: Sequence[int]) -> np.ndarray | None:  # [k + 1, words]
        matcher = self._matchers[request_id]
        if matcher.is_error():
            self._drop_failed(request_id, matcher)
            return None
        out = np.empty((len(drafts) + 1, bitmask_words(self.vocab_size)), dtype=np.int32)
        consumed = 0
        for j in range(len(drafts) + 1):
            matcher.unsafe_compute_mask_ptr(out[j].ctypes.data, out[j].nbytes)
            if j == len(drafts):
                break
            # Drafts were validated when proposed, against this very state; a draft the grammar
            # refuses now would be a bug: mask its later rows as the refusing state's (its row
            # rejects it, so nothing after it can be accepted).
            if matcher.is_stopped() or not matcher.consume_token(drafts[j]):
                out[j + 1:] = out[j]
                break
            consumed += 1
        if consumed:
            matcher.rollback(consumed)
        return out

    def validate_drafts(self, request_id: str, drafts: Sequence[int]) -> list[int]:
        """The longest prefix of drafts the request's grammar accepts from its current state
        (all of them for an unconstrained request)."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return list(drafts)
        if matcher.is_error() or matcher.is_stopped():
            return []
        return list(drafts[: matcher.validate_tokens(list(drafts))])

    def accept_tokens(self, request_id: str, token_ids: Sequence[int]) -> bool:
        """Advances the request's grammar over its newly sampled tokens; False (and the
        constraint dropped) when they do not fit, which a correct mask never lets happen."""
        matcher = self._matchers.get(request_id)
        if matcher is None:
            return True
        for token_id in token_ids:
            if matcher.is_stopped():
                return True  # the grammar is complete; what follows is the EOS it allowed
            if not matcher.consume_token(token_id):
                self._drop_failed(request_id, matcher)
                return False
        return True

    def is_finished(self, request_id: str) -> bool:
        """Whether the request's grammar is complete and admits nothing more."""
        matcher = self._matchers.get(request_id)
        return matcher is not None and matcher.is_stopped()

    def remove(self, request_id: str) -> None:
        self._matchers.pop(request_id, None)

    def _drop_failed(self, request_id: str, matcher: llguidance.LLMatcher) -> None:
        logger.warning("request %s: constrained decoding stopped: %s", request_id, matcher.get_error())
        self._matchers.pop(request_id, None)
