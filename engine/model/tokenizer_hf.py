"""Tokenizers backed by the Hugging Face `tokenizers` library.

`HFTokenizer` wraps a `tokenizers.Tokenizer`, whether it was read from a checkpoint folder's
tokenizer.json (`load_hf_tokenizer`) or built from GGUF metadata (gguf_tokenizer.py). The helpers
that read a folder's tokenizer_config.json, chat templates and generation_config.json are shared
with the tiktoken backend.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import tokenizers
from tokenizers.decoders import DecodeStream as _RustDecodeStream

from engine.model.tokenizer import TokenizerBase


class _TokenizersDecodeStream:
    """A `tokenizers` DecodeStream bound to its tokenizer (the Rust object keeps only ids and offsets)."""

    __slots__ = ("_stream", "_tokenizer")

    def __init__(self, tokenizer: tokenizers.Tokenizer, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._stream = _RustDecodeStream(skip_special_tokens=skip_special_tokens)

    def step(self, token_ids: int | Sequence[int]) -> str | None:
        if not isinstance(token_ids, int):
            token_ids = list(token_ids)
        return self._stream.step(self._tokenizer, token_ids)


class HFTokenizer(TokenizerBase):
    """A `tokenizers.Tokenizer` plus the special-token and chat-template facts around it."""

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        bos_token: str | None,
        eos_token: str | None,
        pad_token: str | None = None,
        unk_token: str | None = None,
        extra_eos_token_ids: Iterable[int] = (),
        chat_templates: Mapping[str, str] | None = None,
    ) -> None:
        # A tokenizer.json may carry truncation/padding settings for training; serving never
        # truncates or pads silently (transformers turns them off per call as well).
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tokenizer = tokenizer
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        special_ids = [token_id for token_id, added in tokenizer.get_added_tokens_decoder().items() if added.special]
        self._init_special_tokens(
            bos_token=bos_token, eos_token=eos_token, pad_token=pad_token, unk_token=unk_token,
            extra_eos_token_ids=extra_eos_token_ids, special_ids=special_ids, chat_templates=chat_templates or {},
        )

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying `tokenizers.Tokenizer` (e.g. for grammar-constrained decoding libraries)."""
        return self._tokenizer

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        # No clean_up_tokenization_spaces: it rewrites " ." to "." and would make streamed text
        # (which never cleans up) differ from the final text.
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def new_decode_stream(self, skip_special_tokens: bool = True) -> _TokenizersDecodeStream:
        return _TokenizersDecodeStream(self._tokenizer, skip_special_tokens)


def load_hf_tokenizer(folder: str) -> HFTokenizer:
    """Loads tokenizer.json and the configuration files next to it in a checkpoint folder."""
    path = os.path.join(folder, "tokenizer.json")
    try:
        tokenizer = tokenizers.Tokenizer.from_file(path)
    except Exception as exc:  # the Rust side raises a bare Exception for malformed files
        raise ValueError(f"cannot read {path}: {exc}") from None
    config = read_tokenizer_config(folder)
    _add_missing_added_tokens(tokenizer, config, folder)
    return HFTokenizer(
        tokenizer,
        bos_token=special_token_text(config, "bos_token"),
        eos_token=special_token_text(config, "eos_token"),
        pad_token=special_token_text(config, "pad_token"),
        unk_token=special_token_text(config, "unk_token"),
        extra_eos_token_ids=read_eos_token_ids(folder),
        chat_templates=read_chat_templates(folder, config),
    )


def _add_missing_added_tokens(tokenizer: tokenizers.Tokenizer, config: Mapping[str, Any], folder: str) -> None:
    # tokenizer_config.json's added_tokens_decoder may name tokens tokenizer.json lacks (older
    # exports); transformers adds them, so we do too. Their ids must then line up.
    decoder = config.get("added_tokens_decoder") or {}
    for token_id_text, entry in decoder.items():
        content = entry.get("content") if isinstance(entry, Mapping) else None
        if not isinstance(content, str) or tokenizer.token_to_id(content) is not None:
            continue
        added = tokenizers.AddedToken(content, special=bool(entry.get("special", False)),
                                      normalized=bool(entry.get("normalized", not entry.get("special", False))),
                                      lstrip=bool(entry.get("lstrip", False)), rstrip=bool(entry.get("rstrip", False)),
                                      single_word=bool(entry.get("single_word", False)))
        tokenizer.add_tokens([added])
        if tokenizer.token_to_id(content) != int(token_id_text):
            raise ValueError(
                f"{folder}/tokenizer_config.json: added token {content!r} has id {token_id_text} but would get "
                f"{tokenizer.token_to_id(content)} (tokenizer.json and tokenizer_config.json disagree)"
            )


def _read_json(path: str) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            value = json.load(file)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object")
    return value


def read_tokenizer_config(folder: str) -> dict[str, Any]:
    """tokenizer_config.json, with special_tokens_map.json filling special tokens it lacks (legacy)."""
    config = _read_json(os.path.join(folder, "tokenizer_config.json"))
    for key, value in _read_json(os.path.join(folder, "special_tokens_map.json")).items():
        config.setdefault(key, value)
    return config


def special_token_text(config: Mapping[str, Any], key: str) -> str | None:
    """A special token's text: configs write either "<s>" or {"content": "<s>", ...}."""
    value = config.get(key)
    if isinstance(value, Mapping):
        value = value.get("content")
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"tokenizer_config.json field {key!r} must be a string or an object with 'content'")


def read_chat_templates(folder: str, config: Mapping[str, Any]) -> dict[str, str]:
    """The chat templates by name ("default" first); the same precedence as transformers.

    chat_template.jinja wins over chat_template.json, which wins over tokenizer_config.json.
    """
    jinja_path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as file:
            return {"default": file.read()}
    template_json = _read_json(os.path.join(folder, "chat_template.json"))
    value = template_json.get("chat_template", config.get("chat_template"))
    if value is None:
        return {}
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):
        templates: dict[str, str] = {}
        for entry in value:
            if not (isinstance(entry, Mapping) and isinstance(entry.get("name"), str)
                    and isinstance(entry.get("template"), str)):
                raise ValueError(f"{folder}: chat_template list entries need string 'name' and 'template'")
            templates[entry["name"]] = entry["template"]
        if "default" not in templates and templates:
            templates["default"] = next(iter(templates.values()))
        return templates
    raise ValueError(f"{folder}: chat_template must be a string or a list of {{name, template}} objects")


def read_eos_token_ids(folder: str) -> list[int]:
    """eos_token_id from generation_config.json and config.json (an int or a list in either)."""
    eos_ids: list[int] = []
    for name in ("generation_config.json", "config.json"):
        value = _read_json(os.path.join(folder, name)).get("eos_token_id")
        values = value if isinstance(value, list) else [value]
        eos_ids.extend(v for v in values if isinstance(v, int) and not isinstance(v, bool))
    return eos_ids
