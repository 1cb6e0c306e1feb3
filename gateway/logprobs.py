"""Token ids -> the token strings and byte lists that logprobs responses show."""

from __future__ import annotations

from collections.abc import Sequence

from engine.model.tokenizer import Tokenizer
from engine.protocol import TokenLogprobs
from gateway.schemas.openai_chat import TokenLogprob, TopLogprob
from gateway.schemas.openai_completions import CompletionLogprobs


class TokenTexts:
    """Caches each token's text (decoded alone, special tokens kept) for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            self._texts[token_id] = text
        return text


def chat_logprobs(entries: Sequence[TokenLogprobs], texts: TokenTexts, num_top: int) -> list[TokenLogprob]:
    """The chat API's logprobs.content list (num_top alternatives per token)."""
    result = []
    for entry in entries:
        token = texts(entry.token_id)
        top = [TopLogprob(texts(token_id), logprob, list(texts(token_id).encode()))
               for token_id, logprob in entry.top[:num_top]]
        result.append(TokenLogprob(token, entry.logprob, list(token.encode()), top))
    return result


def completion_logprobs(entries: Sequence[TokenLogprobs], texts: TokenTexts, num_top: int,
                        text_offset: int) -> CompletionLogprobs:
    """The completions API's logprobs object; offsets count characters from text_offset."""
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    offsets: list[int] = []
    for entry in entries:
        token = texts(entry.token_id)
        tokens.append(token)
        token_logprobs.append(entry.logprob)
        top: dict[str, float] = {}
        for token_id, logprob in entry.top[:num_top]:
            top.setdefault(texts(token_id), logprob)
        top_logprobs.append(top)
        offsets.append(text_offset)
        text_offset += len(token)
    return CompletionLogprobs(tokens, token_logprobs, top_logprobs, offsets)
