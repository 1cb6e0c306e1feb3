"""Fill-in-the-middle prompts from a tokenizer's FIM tokens."""

from __future__ import annotations

import pytest
import tokenizers

from engine.model.resolve import resolve_model
from engine.model.tokenizer import load_tokenizer
from engine.model.tokenizer_hf import HFTokenizer
from gateway.fim import build_fim_prompt, find_fim_tokens


@pytest.fixture(scope="module")
def smollm():
    return load_tokenizer(resolve_model(None))


def with_tokens(base: HFTokenizer, tokens: list[str]) -> HFTokenizer:
    """The embedded tokenizer plus extra special tokens (a StarCoder/Qwen-Coder-like vocabulary)."""
    backend = tokenizers.Tokenizer.from_str(base.backend.to_str())
    backend.add_special_tokens(tokens)
    return HFTokenizer(backend, bos_token=base.bos_token, eos_token=base.eos_token)


def test_smollm2_has_no_fim_tokens(smollm) -> None:
    assert find_fim_tokens(smollm) is None


@pytest.mark.parametrize("spellings", [
    ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"],
    ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"],
])
def test_prefix_suffix_middle_layout(smollm, spellings: list[str]) -> None:
    tokenizer = with_tokens(smollm, spellings)
    fim = find_fim_tokens(tokenizer)
    assert fim is not None
    ids = [tokenizer.token_to_id(token) for token in spellings]
    assert (fim.prefix_id, fim.suffix_id, fim.middle_id) == tuple(ids)
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    prompt = build_fim_prompt(tokenizer, fim, prefix, suffix)
    expected = ([ids[0]] + tokenizer.encode(prefix) + [ids[1]] + tokenizer.encode(suffix) + [ids[2]])
    assert prompt == expected
    # Marker text written inside the code is never mistaken for the markers' positions.
    decoded = tokenizer.decode(prompt, skip_special_tokens=False)
    assert decoded == f"{spellings[0]}{prefix}{spellings[1]}{suffix}{spellings[2]}"


def test_an_incomplete_set_does_not_count(smollm) -> None:
    assert find_fim_tokens(with_tokens(smollm, ["<fim_prefix>", "<fim_suffix>"])) is None
