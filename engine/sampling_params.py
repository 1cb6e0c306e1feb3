"""Sampling parameters of one request.

A msgspec Struct so that it crosses the engine socket as is. This module is a leaf: it imports
nothing of ours, so engine.protocol (and through it the gateway) can use it without torch.
Every invalid value raises ValueError naming the parameter.
"""

from __future__ import annotations

import math

import msgspec

# Temperatures below this are treated as greedy (argmax), as in vLLM.
GREEDY_TEMPERATURE_EPS = 1e-5


class SamplingParams(msgspec.Struct, kw_only=True, omit_defaults=True):
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to the model's context length
    min_tokens: int = 0
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None  # number of top logprobs per generated token (0: only the chosen)
    logit_bias: dict[int, float] | None = None
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        _check(isinstance(self.n, int) and self.n >= 1, "n", f"must be an integer >= 1, got {self.n!r}")
        _check(_finite(self.temperature) and self.temperature >= 0.0, "temperature",
               f"must be a finite number >= 0, got {self.temperature!r}")
        _check(_finite(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p!r}")
        _check(isinstance(self.top_k, int) and (self.top_k >= 0 or self.top_k == -1), "top_k",
               f"must be -1, 0 (disabled) or a positive integer, got {self.top_k!r}")
        _check(_finite(self.min_p) and 0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_finite(value) and -2.0 <= value <= 2.0, name, f"must be in [-2, 2], got {value!r}")
        _check(_finite(self.repetition_penalty) and self.repetition_penalty > 0.0, "repetition_penalty",
               f"must be a finite number > 0, got {self.repetition_penalty!r}")
        _check(self.seed is None or isinstance(self.seed, int), "seed", f"must be an integer, got {self.seed!r}")
        _check(self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1), "max_tokens",
               f"must be an integer >= 1, got {self.max_tokens!r}")
        _check(isinstance(self.min_tokens, int) and self.min_tokens >= 0, "min_tokens",
               f"must be an integer >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None:
            _check(self.min_tokens <= self.max_tokens, "min_tokens",
                   f"must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", "must be non-empty strings")
        _check(all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids), "stop_token_ids",
               "must be non-negative integers")
        _check(self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= 20), "logprobs",
               f"must be an integer in [0, 20], got {self.logprobs!r}")
        if self.logit_bias is not None:
            for token_id, bias in self.logit_bias.items():
                _check(isinstance(token_id, int) and token_id >= 0, "logit_bias",
                       f"keys must be token ids >= 0, got {token_id!r}")
                _check(_finite(bias) and -100.0 <= bias <= 100.0, "logit_bias",
                       f"values must be in [-100, 100], got {bias!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS

    def validate_vocab(self, vocab_size: int) -> None:
        """Checks token ids against the model's vocabulary (known only to the engine)."""
        for token_id in self.stop_token_ids:
            _check(token_id < vocab_size, "stop_token_ids", f"token id {token_id} is outside the vocabulary ({vocab_size})")
        for token_id in self.logit_bias or {}:
            _check(token_id < vocab_size, "logit_bias", f"token id {token_id} is outside the vocabulary ({vocab_size})")

    def clone(self, **changes: object) -> SamplingParams:
        return msgspec.structs.replace(self, **changes)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{name} {message}")
