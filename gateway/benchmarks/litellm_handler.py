"""The instant engine as a LiteLLM custom provider, for the gateway-overhead benchmark's peer.

LiteLLM proxy loads `instant_llm` (through a one-line shim next to its config file, written by
overhead.py) and calls `acompletion` for every request. The handler does the work the draftgate
gateway does for the same request, with the same code: render the chat template, tokenize, run
the instant engine, collect its deltas; LiteLLM builds the HTTP response around it. Only LiteLLM
imports this module (it runs in LiteLLM's own environment).
"""

from __future__ import annotations

import os
from typing import Any

import litellm
from litellm import CustomLLM
from litellm.types.utils import ModelResponse, Usage

from engine.model.resolve import resolve_model
from engine.model.tokenizer import load_tokenizer
from engine.sampling_params import SamplingParams
from gateway.benchmarks.instant_engine import InstantEngineClient
from gateway.chat_prompt import render_chat_prompt
from gateway.tool_prompt import ToolChoice

# LiteLLM's environment does not have the embedded model's distribution: the driver passes the path.
GGUF_PATH_ENV = "DRAFTGATE_BENCH_GGUF"


class InstantLLM(CustomLLM):
    def __init__(self) -> None:
        super().__init__()
        self.tokenizer = load_tokenizer(resolve_model(os.environ[GGUF_PATH_ENV]))
        self.engine = InstantEngineClient(self.tokenizer)

    async def acompletion(self, *args: Any, **kwargs: Any) -> ModelResponse:
        messages = kwargs["messages"]
        optional_params = kwargs.get("optional_params") or {}
        prompt = render_chat_prompt(self.tokenizer, messages, None, ToolChoice("none"))
        params = SamplingParams(max_tokens=optional_params.get("max_tokens") or 16)
        text, num_tokens, finish_reason = "", 0, "stop"
        async for delta in self.engine.generate(prompt.token_ids, params, request_id="litellm"):
            text += delta.text
            num_tokens += len(delta.new_token_ids)
            finish_reason = delta.finish_reason or finish_reason
        response: ModelResponse = kwargs["model_response"]
        response.choices[0].message.content = text  # type: ignore[union-attr]
        response.choices[0].finish_reason = finish_reason
        response.model = kwargs.get("model", "instant")
        response.usage = Usage(prompt_tokens=len(prompt.token_ids), completion_tokens=num_tokens,  # type: ignore[attr-defined]
                               total_tokens=len(prompt.token_ids) + num_tokens)
        return response

    def completion(self, *args: Any, **kwargs: Any) -> ModelResponse:
        raise NotImplementedError("the benchmark drives the proxy's async path only")


instant_llm = InstantLLM()
litellm.suppress_debug_info = True
