"""Incremental detokenization: streamed text equals one-shot decoding; stop strings cut exactly."""

from __future__ import annotations

import functools
import random

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.detokenizer import IncrementalDetokenizer
from engine.model.tokenizer import Tokenizer, load_tokenizer
from engine.model.tokenizer_tiktoken import TiktokenTokenizer

TEXTS = [
    "Hello, world! The answer is 42.",
    "emoji 😀👍🏽 family 👨‍👩‍👧 and flags 🇫🇷🇯🇵",
    "日本語のテキストと中文文本，还有한국어",
    "def f(x):\n    return x * 2  # naïve café\n",
    "mixed: a😀b日c\u00e9d\U0001f9d1\u200d\U0001f4bbe",
]


@functools.cache
def embedded() -> Tokenizer:
    return load_tokenizer(None)


@functools.cache
def bytes_only() -> TiktokenTokenizer:
    """A tiktoken tokenizer whose tokens are single bytes: every multi-byte character splits."""
    ranks = {bytes([b]): b for b in range(256)}
    encoding = tiktoken.Encoding(name="bytes", pat_str=r"\s+|\S+", mergeable_ranks=ranks,
                                 special_tokens={"<|eot|>": 256})
    return TiktokenTokenizer(encoding, ranks, {"<|eot|>": 256}, special_ids=frozenset({256}), bos_token=None,
                             eos_token="<|eot|>", pad_token=None, unk_token=None, add_bos_token=False,
                             extra_eos_token_ids=(), chat_templates={})


TOKENIZERS = {"embedded": embedded, "bytes": bytes_only}


def _stream(detokenizer: IncrementalDetokenizer, ids: list[int], chunk_sizes: list[int] | None = None) -> list[str]:
    deltas, position, sizes = [], 0, iter(chunk_sizes or [])
    while position < len(ids):
        size = next(sizes, 1)
        deltas.append(detokenizer.update(ids[position:position + size]))
        position += size
    deltas.append(detokenizer.flush())
    return deltas


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("text", TEXTS)
def test_streaming_equals_one_shot_decode(name: str, text: str) -> None:
    tokenizer = TOKENIZERS[name]()
    ids = tokenizer.encode(text)
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
    deltas = _stream(detokenizer, ids)
    assert "".join(deltas) == detokenizer.text == tokenizer.decode(ids) == text
    assert all("\ufffd" not in delta for delta in deltas)  # never half a character
    # Several tokens per step (speculative decoding accepts a few at once) give the same text.
    chunked = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
    assert "".join(_stream(chunked, ids, [3, 1, 4, 1, 5, 9, 2, 6] * 20)) == text


def test_multibyte_character_is_held_until_complete() -> None:
    tokenizer = bytes_only()
    detokenizer = IncrementalDetokenizer(tokenizer)
    ids = tokenizer.encode("a😀")
    assert [detokenizer.update([i]) for i in ids] == ["a", "", "", "", "😀"]


def test_truncated_character_is_flushed_as_one_shot_decode_shows_it() -> None:
    tokenizer = bytes_only()
    ids = tokenizer.encode("ok 😀")[:-2] + [256]  # half an emoji, then a skipped special token
    for name, skip in (("skip", True), ("keep", False)):
        detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip)
        text = "".join(_stream(detokenizer, ids))
        assert text == tokenizer.decode(ids, skip_special_tokens=skip), name
    assert tokenizer.decode(ids) == "ok \ufffd"


def test_special_tokens_follow_skip_special_tokens() -> None:
    tokenizer = embedded()
    ids = tokenizer.encode("Hi<|im_end|>")
    assert "".join(_stream(IncrementalDetokenizer(tokenizer, skip_special_tokens=True), ids)) == "Hi"
    assert "".join(_stream(IncrementalDetokenizer(tokenizer, skip_special_tokens=False), ids)) == "Hi<|im_end|>"


def test_stop_string_spanning_tokens() -> None:
    tokenizer = embedded()
    ids = tokenizer.encode("Hello world, and goodbye")
    assert [tokenizer.decode([i]) for i in ids[:2]] == ["Hello", " world"]  # "lo wo" spans two tokens
    detokenizer = IncrementalDetokenizer(tokenizer, stop=["lo wo"])
    deltas = [detokenizer.update([i]) for i in ids]
    assert deltas[0] == "Hel"  # "lo" is held back: it may start the stop string
    assert "".join(deltas) == "Hel" == detokenizer.text
    assert detokenizer.stop_string == "lo wo" and detokenizer.finished
    assert detokenizer.flush() == ""  # nothing after the stop string, ever


def test_stop_string_include_in_output() -> None:
    tokenizer = embedded()
    detokenizer = IncrementalDetokenizer(tokenizer, stop=["lo wo"], include_stop_str_in_output=True)
    assert "".join(_stream(detokenizer, tokenizer.encode("Hello world, and goodbye"))) == "Hello wo"


def test_stop_at_the_very_start() -> None:
    tokenizer = embedded()
    for include, expected in ((False, ""), (True, "Hello")):
        detokenizer = IncrementalDetokenizer(tokenizer, stop=["Hello"], include_stop_str_in_output=include)
        ids = tokenizer.encode("Hello world")
        assert detokenizer.update(ids[:1]) == expected
        assert detokenizer.stop_string == "Hello"
        assert detokenizer.update(ids[1:]) == "" and detokenizer.flush() == "" and detokenizer.text == expected


def test_held_back_prefix_is_flushed_at_the_end() -> None:
    tokenizer = embedded()
    detokenizer = IncrementalDetokenizer(tokenizer, stop=["<|user|>"], skip_special_tokens=False)
    ids = tokenizer.encode("The answer <|")
    streamed = "".join(detokenizer.update([i]) for i in ids)
    assert streamed == "The answer "  # "<|" could still become "<|user|>"
    assert detokenizer.flush() == "<|"
    assert detokenizer.text == "The answer <|" and detokenizer.stop_string is None


def test_earliest_ending_stop_string_wins() -> None:
    tokenizer = bytes_only()
    # All in one update: "cd" completes first (at 'd'), although "bcdef" starts earlier.
    detokenizer = IncrementalDetokenizer(tokenizer, stop=["bcdef", "de", "cd"])
    assert detokenizer.update(tokenizer.encode("abcdefg")) == "ab"
    assert detokenizer.stop_string == "cd"
    # Both end at 'd': the longer one, which starts earlier, cuts more.
    detokenizer = IncrementalDetokenizer(tokenizer, stop=["cd", "bcd"])
    assert detokenizer.update(tokenizer.encode("abcdefg")) == "a"
    assert detokenizer.stop_string == "bcd"


def test_empty_stop_string_is_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        IncrementalDetokenizer(bytes_only(), stop=[""])


def _reference(text: str, stops: list[str], include: bool) -> tuple[str, str | None]:
    matches = [(text.find(s) + len(s), text.find(s), s) for s in stops if s in text]
    if not matches:
        return text, None
    end, start, stop = min(matches, key=lambda m: (m[0], m[1]))
    return text[:end if include else start], stop


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab c😀日\n", max_size=40),
    stops=st.lists(st.text(alphabet="ab c😀日\n", min_size=1, max_size=4), max_size=3),
    include=st.booleans(),
    seed=st.integers(0, 2**16),
    which=st.sampled_from(sorted(TOKENIZERS)),
)
def test_stop_strings_against_a_one_shot_reference(text: str, stops: list[str], include: bool, seed: int,
                                                   which: str) -> None:
    tokenizer = TOKENIZERS[which]()
    ids = tokenizer.encode(text)
    rng = random.Random(seed)
    expected, expected_stop = _reference(text, stops, include)
    detokenizer = IncrementalDetokenizer(tokenizer, stop=stops, include_stop_str_in_output=include)
    emitted = ""
    position = 0
    while position < len(ids):
        size = rng.randint(1, 3)
        emitted += detokenizer.update(ids[position:position + size])
        position += size
        assert expected.startswith(emitted)  # never anything that the final answer lacks
    emitted += detokenizer.flush()
    assert emitted == expected == detokenizer.text
    assert detokenizer.stop_string == expected_stop
