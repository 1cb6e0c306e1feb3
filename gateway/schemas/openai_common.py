"""Types shared by the OpenAI endpoints: usage, stream options, the model list."""

from __future__ import annotations

import msgspec


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int = 0


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # Always present (clients read usage.prompt_tokens_details.cached_tokens without a guard).
    prompt_tokens_details: PromptTokensDetails


def make_usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int) -> Usage:
    return Usage(num_prompt_tokens, num_completion_tokens, num_prompt_tokens + num_completion_tokens,
                 PromptTokensDetails(num_cached_tokens))


class ModelCard(msgspec.Struct):
    id: str
    created: int
    max_model_len: int
    object: str = "model"
    owned_by: str = "draftgate"
    root: str | None = None


class ModelList(msgspec.Struct):
    data: list[ModelCard]
    object: str = "list"
