"""The tiktoken backend on a small hand-made tiktoken file (Llama 3's format), exact ids worked out by hand."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from engine.model.resolve import resolve_model
from engine.model.tokenizer import Tokenizer, load_tokenizer
from engine.model.tokenizer_tiktoken import TiktokenTokenizer

# Ranks 0-255 are the single bytes; then a few merges, each reachable from lower ranks.
MERGES = {b"he": 256, b"ll": 257, b"hell": 258, b" w": 259, b"or": 260, b" wor": 261, b"ld": 262,
          b" world": 263, b"hello": 264, b"12": 265, b"34": 266, b"1234": 267}
SPECIALS = {"<|begin_of_text|>": 300, "<|end_of_text|>": 301, "<|eot_id|>": 302,
            "<|start_header_id|>": 303, "<|end_header_id|>": 304}
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
            "{{ m.content | trim }}<|eot_id|>{% endfor %}"
            "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def _write_folder(folder: Path, model_type: str = "llama") -> Path:
    folder.mkdir()
    lines = [f"{base64.b64encode(bytes([b])).decode()} {b}" for b in range(256)]
    lines += [f"{base64.b64encode(token).decode()} {rank}" for token, rank in MERGES.items()]
    (folder / "tokenizer.model").write_text("\n".join(lines) + "\n")
    config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "chat_template": TEMPLATE,
        "added_tokens_decoder": {str(i): {"content": text, "special": True} for text, i in SPECIALS.items()},
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [301, 302]}))
    return folder


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return load_tokenizer(resolve_model(str(_write_folder(tmp_path_factory.mktemp("tt") / "llama3"))))


def test_encode_applies_merges_by_rank(tokenizer: Tokenizer) -> None:
    assert isinstance(tokenizer, TiktokenTokenizer)
    # "hello" -> he|l|l|o -> he|ll|o -> hell|o -> hello; " world" -> " w"|or|l|d -> ... -> " world".
    assert tokenizer.encode("hello world") == [264, 263]
    # Llama 3 splits digits in groups of three: "123"|"45", so "1234" can never form.
    assert tokenizer.encode("12345") == [265, ord("3"), ord("4"), ord("5")]
    assert tokenizer.encode("1234") == [265, ord("3"), ord("4")]
    assert tokenizer.encode("é") == [0xC3, 0xA9]


def test_special_tokens(tokenizer: Tokenizer) -> None:
    assert tokenizer.encode("<|begin_of_text|>hello<|eot_id|>") == [300, 264, 302]
    assert tokenizer.encode("hello", add_special_tokens=True) == [300, 264]
    assert tokenizer.decode([300, 264, 302]) == "hello"
    assert tokenizer.decode([300, 264, 302], skip_special_tokens=False) == "<|begin_of_text|>hello<|eot_id|>"
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (300, 302)
    assert tokenizer.eos_token_ids == frozenset({301, 302})
    assert tokenizer.all_special_ids == frozenset(SPECIALS.values())
    assert tokenizer.vocab_size == 305
    assert tokenizer.pad_token_id is None


def test_token_strings_use_byte_level_spelling(tokenizer: Tokenizer) -> None:
    assert tokenizer.id_to_token(ord(" ")) == "Ġ"
    assert tokenizer.id_to_token(ord("\n")) == "Ċ"
    assert tokenizer.id_to_token(263) == "Ġworld"
    assert tokenizer.id_to_token(302) == "<|eot_id|>"
    assert tokenizer.token_to_id("Ġworld") == 263
    assert tokenizer.token_to_id("<|end_header_id|>") == 304
    assert tokenizer.token_to_id("absent") is None
    assert tokenizer.id_to_token(290) is None  # a hole between the ranks and the specials


def test_decode_round_trip_and_broken_utf8(tokenizer: Tokenizer) -> None:
    text = "hello world 😀 naïve 日本 12345\n"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.decode([0xC3]) == "\ufffd"  # half a character


def test_decode_stream_waits_for_whole_characters(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("a😀b")
    stream = tokenizer.new_decode_stream(skip_special_tokens=True)
    pieces = [stream.step(token_id) for token_id in ids]
    assert pieces == ["a", None, None, None, "😀", "b"]
    assert stream.step([300, 264]) == "hello"  # a list, with a skipped special
    keep = tokenizer.new_decode_stream(skip_special_tokens=False)
    assert keep.step(302) == "<|eot_id|>"


def test_chat_template(tokenizer: Tokenizer) -> None:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": " hi "}])
    assert rendered == ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert tokenizer.encode(rendered)[:2] == [300, 303]


def test_unknown_family_raises(tmp_path: Path) -> None:
    folder = _write_folder(tmp_path / "odd", model_type="mystery")
    with pytest.raises(ValueError, match="model_type 'mystery'"):
        load_tokenizer(resolve_model(str(folder)))
