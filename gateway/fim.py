"""Fill-in-the-middle prompts from the model's own FIM tokens.

Code models trained for infilling mark the prefix, the suffix and the point to fill with three
special tokens; the prompt is "prefix-suffix-middle" (PSM): <prefix-token> prefix
<suffix-token> suffix <middle-token>, and the model writes the middle. The token spellings differ
by family; they are looked up in the tokenizer's vocabulary and must all be there. A tokenizer
without them (SmolLM2's) cannot infill: the completions route then refuses `suffix` with 400.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.model.tokenizer import Tokenizer

# (prefix, suffix, middle) spellings, in PSM order.
FIM_TOKEN_SPELLINGS: tuple[tuple[str, str, str], ...] = (
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, SantaCoder, SmolLM (v1)
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, CodeGemma-style
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
    ("▁<PRE>", "▁<SUF>", "▁<MID>"),  # CodeLlama
    ("<PRE>", "<SUF>", "<MID>"),
)


@dataclass(frozen=True)
class FimTokens:
    prefix_id: int
    suffix_id: int
    middle_id: int


def find_fim_tokens(tokenizer: Tokenizer) -> FimTokens | None:
    """The tokenizer's FIM tokens, or None when it has no complete set."""
    for spellings in FIM_TOKEN_SPELLINGS:
        ids = [tokenizer.token_to_id(token) for token in spellings]
        if all(token_id is not None for token_id in ids):
            return FimTokens(*ids)  # type: ignore[arg-type]
    return None


def build_fim_prompt(tokenizer: Tokenizer, tokens: FimTokens, prefix: str, suffix: str) -> list[int]:
    """[BOS if the model uses one] <prefix> prefix <suffix> suffix <middle>, as token ids.

    Each piece is encoded on its own so that no merge crosses a FIM marker.
    """
    leading = tokenizer.encode("", add_special_tokens=True)
    return (
        leading
        + [tokens.prefix_id]
        + tokenizer.encode(prefix, add_special_tokens=False)
        + [tokens.suffix_id]
        + tokenizer.encode(suffix, add_special_tokens=False)
        + [tokens.middle_id]
    )
