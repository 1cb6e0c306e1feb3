"""Request fields -> SamplingParams, with refusals naming the client's parameter."""

from __future__ import annotations

import pytest

from gateway.errors import APIError
from gateway.sampling import SamplingRequest, build_sampling_params

LIMITS = {"max_model_len": 100, "vocab_size": 1000, "max_n": 4}


def build(**fields):
    return build_sampling_params(SamplingRequest(**{"num_prompt_tokens": 10, "max_tokens": None, **fields}), **LIMITS)


def refusal(**fields) -> APIError:
    with pytest.raises(APIError) as raised:
        build(**fields)
    assert raised.value.status == 400
    return raised.value


def test_defaults_follow_the_openai_api() -> None:
    params = build()
    assert params.max_tokens == 90  # up to the context
    assert params.temperature == 1.0 and params.top_p == 1.0 and params.n == 1 and params.logprobs is None


def test_fields_are_carried_over() -> None:
    params = build(max_tokens=5, temperature=0.0, stop="x", extra_stop=["</tool_call>", "x"], stop_token_ids=[7],
                   logit_bias={"12": -100.0}, logprobs=3, seed=42, n=2, top_k=5, min_tokens=2, ignore_eos=True)
    assert params.max_tokens == 5 and params.greedy and params.stop == ["x", "</tool_call>"]
    assert params.logit_bias == {12: -100.0} and params.logprobs == 3 and params.seed == 42 and params.n == 2
    assert params.top_k == 5 and params.min_tokens == 2 and params.ignore_eos and params.stop_token_ids == [7]


def test_context_limits() -> None:
    assert build(max_tokens=90).max_tokens == 90
    assert refusal(max_tokens=91).param == "max_tokens"
    assert refusal(max_tokens=91, max_tokens_param="max_completion_tokens").param == "max_completion_tokens"
    error = refusal(num_prompt_tokens=100, prompt_param="prompt")
    assert error.param == "prompt" and error.code == "context_length_exceeded"


@pytest.mark.parametrize(("fields", "param"), [
    ({"n": 5}, "n"), ({"n": 0}, "n"), ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": float("nan")}, "temperature"), ({"top_p": 1.5}, "top_p"), ({"seed": 2**64}, "seed"),
    ({"top_k": 2**40}, "top_k"), ({"priority": 2**40}, "priority"),
    ({"logit_bias": {"x": 1.0}}, "logit_bias"), ({"logit_bias": {"1000": 1.0}}, "logit_bias"),
    ({"stop_token_ids": [1000]}, "stop_token_ids"), ({"stop": [""]}, "stop"),
    ({"logprobs": 25, "logprobs_param": "top_logprobs"}, "top_logprobs"), ({"min_tokens": 200}, "min_tokens"),
    ({"frequency_penalty": -3.0}, "frequency_penalty"),
])
def test_refusals_name_the_parameter(fields: dict, param: str) -> None:
    assert refusal(**fields).param == param
