"""Request fields -> engine SamplingParams, with every refusal naming the client's parameter.

SamplingParams validates values itself (raising ValueError naming its field); this module adds
what only the gateway knows: the context left after the prompt, the vocabulary size for
logit_bias and stop_token_ids, the gateway's n limit, integer ranges that must fit the engine's
wire format, and the client-facing parameter names (max_completion_tokens, top_logprobs, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams
from gateway.errors import APIError, bad_request, value_error

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_INT32_MAX = 2**31 - 1


@dataclass
class SamplingRequest:
    """The sampling fields common to the three generation APIs, as the client sent them."""

    num_prompt_tokens: int
    max_tokens: int | None
    max_tokens_param: str = "max_tokens"
    prompt_param: str = "messages"
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    extra_stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None
    logprobs_param: str = "logprobs"
    logit_bias: dict[str, float] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    priority: int = 0


def build_sampling_params(request: SamplingRequest, *, max_model_len: int, vocab_size: int,
                          max_n: int) -> SamplingParams:
    """The engine's SamplingParams for a request, or a 400 naming the parameter at fault.

    max_tokens None means "up to the context": the room the prompt leaves in max_model_len.
    """
    if not 1 <= request.n <= max_n:
        raise bad_request(f"n must be between 1 and {max_n}, got {request.n}", param="n")
    num_prompt_tokens = request.num_prompt_tokens
    if num_prompt_tokens >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
            f"{num_prompt_tokens} tokens (at least one token must be left for the output)",
            param=request.prompt_param, code="context_length_exceeded",
        )
    room = max_model_len - num_prompt_tokens
    max_tokens = request.max_tokens
    if max_tokens is None:
        max_tokens = room
    elif max_tokens < 1:
        raise bad_request(f"{request.max_tokens_param} must be at least 1, got {max_tokens}",
                          param=request.max_tokens_param)
    elif max_tokens > room:
        raise bad_request(
            f"{request.max_tokens_param} is {max_tokens}, but the prompt has {num_prompt_tokens} tokens and the "
            f"model's maximum context length is {max_model_len}: at most {room} tokens can be generated",
            param=request.max_tokens_param, code="context_length_exceeded",
        )
    _check_int_range(request.seed, "seed", _INT64_MIN, _INT64_MAX)
    _check_int_range(request.top_k, "top_k", -1, _INT32_MAX)
    _check_int_range(request.min_tokens, "min_tokens", 0, _INT32_MAX)
    _check_int_range(request.priority, "priority", -_INT32_MAX, _INT32_MAX)
    stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    for token_id in request.stop_token_ids or []:
        if not 0 <= token_id < vocab_size:
            raise bad_request(f"stop_token_ids: token id {token_id} is outside the vocabulary (0..{vocab_size - 1})",
                              param="stop_token_ids")
    try:
        params = SamplingParams(
            n=request.n,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=request.top_k or 0,
            min_p=request.min_p or 0.0,
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            repetition_penalty=1.0 if request.repetition_penalty is None else request.repetition_penalty,
            seed=request.seed,
            max_tokens=max_tokens,
            min_tokens=request.min_tokens,
            stop=stops + [s for s in request.extra_stop if s not in stops],
            stop_token_ids=list(request.stop_token_ids or []),
            include_stop_str_in_output=request.include_stop_str_in_output,
            ignore_eos=request.ignore_eos,
            logprobs=request.logprobs,
            logit_bias=_logit_bias(request.logit_bias, vocab_size),
            skip_special_tokens=request.skip_special_tokens,
        )
    except ValueError as error:
        raise value_error(error, SamplingParams.__struct_fields__,
                          {"max_tokens": request.max_tokens_param, "logprobs": request.logprobs_param}) from None
    return params


def _check_int_range(value: int | None, name: str, low: int, high: int) -> None:
    if value is not None and not low <= value <= high:
        raise bad_request(f"{name} must be between {low} and {high}, got {value}", param=name)


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    if not bias:
        return None
    result: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token_id = int(key)
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids, got {key!r}", param="logit_bias") from None
        if not 0 <= token_id < vocab_size:
            raise bad_request(f"logit_bias: token id {token_id} is outside the vocabulary (0..{vocab_size - 1})",
                              param="logit_bias")
        result[token_id] = value
    return result


def check_token_ids(token_ids: Sequence[int], vocab_size: int, param: str) -> None:
    """Token-id prompts: every id must be in the vocabulary."""
    for token_id in token_ids:
        if not 0 <= token_id < vocab_size:
            raise APIError(400, f"{param}: token id {token_id} is outside the vocabulary (0..{vocab_size - 1})",
                           param=param)
