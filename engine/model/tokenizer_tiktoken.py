"""Tokenizers backed by `tiktoken`, for folders that ship a tiktoken-format BPE file.

The file (Llama 3's original tokenizer.model, Qwen's qwen.tiktoken) holds one "base64token rank"
line per token; the rank is the token id and the merge priority. It carries neither the split
regex nor the special tokens: the regex comes from the model family (config.json model_type),
the special tokens from tokenizer_config.json's added_tokens_decoder.

id_to_token/token_to_id speak the byte-level strings of a Hugging Face tokenizer.json ("Ġthe"),
so the same vocabulary reads the same whichever backend loaded it.
"""

from __future__ import annotations

import base64
import codecs
import functools
import json
import os
import re
from collections.abc import Sequence

import tiktoken

from engine.model.tokenizer import LLAMA3_SPLIT_PATTERN, QWEN2_SPLIT_PATTERN, TokenizerBase
from engine.model.tokenizer_hf import (
    read_chat_templates,
    read_eos_token_ids,
    read_tokenizer_config,
    special_token_text,
)

# Split regexes by config.json model_type (the families that ship tiktoken files).
PATTERNS_BY_MODEL_TYPE = {"llama": LLAMA3_SPLIT_PATTERN, "qwen": QWEN2_SPLIT_PATTERN, "qwen2": QWEN2_SPLIT_PATTERN}

_TIKTOKEN_LINE = re.compile(rb"^[A-Za-z0-9+/]+=*[ \t]+\d+\s*$")


@functools.cache
def _byte_to_unicode() -> tuple[str, ...]:
    # GPT-2's printable stand-ins for bytes: printable Latin-1 bytes stand for themselves, the
    # rest map to U+0100 onwards in byte order (so b" " is "Ġ" and b"\n" is "Ċ").
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table: dict[int, str] = {byte: chr(byte) for byte in printable}
    next_code = 256
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(next_code)
            next_code += 1
    return tuple(table[byte] for byte in range(256))


def bytes_to_token_text(token_bytes: bytes) -> str:
    table = _byte_to_unicode()
    return "".join(table[byte] for byte in token_bytes)


def find_tiktoken_file(folder: str) -> str | None:
    """tokenizer.model if it is in tiktoken format (not SentencePiece), else the first *.tiktoken file."""
    candidates = [os.path.join(folder, "tokenizer.model")]
    candidates += sorted(os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".tiktoken"))
    for path in candidates:
        if os.path.isfile(path) and _looks_like_tiktoken(path):
            return path
    return None


def _looks_like_tiktoken(path: str) -> bool:
    with open(path, "rb") as file:
        first_line = file.readline(4096)
    return bool(_TIKTOKEN_LINE.match(first_line))


def read_tiktoken_ranks(path: str) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as file:
        for line_number, line in enumerate(file, start=1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                raise ValueError(f"{path}:{line_number}: expected 'base64token rank'")
            try:
                ranks[base64.b64decode(parts[0], validate=True)] = int(parts[1])
            except ValueError:
                raise ValueError(f"{path}:{line_number}: invalid base64 token") from None
    return ranks


class _Utf8DecodeStream:
    """Token bytes through an incremental UTF-8 decoder: a character split across tokens waits."""

    __slots__ = ("_decoder", "_owner", "_skip_ids")

    def __init__(self, owner: TiktokenTokenizer, skip_special_tokens: bool) -> None:
        self._owner = owner
        self._skip_ids: frozenset[int] = owner.all_special_ids if skip_special_tokens else frozenset()
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def step(self, token_ids: int | Sequence[int]) -> str | None:
        ids = [token_ids] if isinstance(token_ids, int) else token_ids
        data = b"".join(self._owner.token_bytes(token_id) for token_id in ids if token_id not in self._skip_ids)
        text = self._decoder.decode(data)
        return text or None


class TiktokenTokenizer(TokenizerBase):
    """A tiktoken Encoding plus the special-token and chat-template facts around it.

    `added_tokens` (text -> id) are all recognised in encoded text; those in `special_ids` are
    also dropped by decode(skip_special_tokens=True).
    """

    def __init__(self, encoding: tiktoken.Encoding, ranks: dict[bytes, int], added_tokens: dict[str, int], *,
                 special_ids: frozenset[int], bos_token: str | None, eos_token: str | None, pad_token: str | None,
                 unk_token: str | None, add_bos_token: bool, extra_eos_token_ids: Sequence[int],
                 chat_templates: dict[str, str]) -> None:
        self._encoding = encoding
        self._ranks = ranks
        self._added_by_text = dict(added_tokens)
        self._added_by_id = {token_id: text for text, token_id in added_tokens.items()}
        self._id_by_text: dict[str, int] | None = None  # byte-level strings, built on first use
        self.vocab_size = encoding.n_vocab
        self._init_special_tokens(
            bos_token=bos_token, eos_token=eos_token, pad_token=pad_token, unk_token=unk_token,
            extra_eos_token_ids=extra_eos_token_ids, special_ids=special_ids, chat_templates=chat_templates,
        )
        self._prefix_ids = [self.bos_token_id] if add_bos_token and self.bos_token_id is not None else []

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # Special tokens written in the text are recognised, as Hugging Face tokenizers do.
        ids = self._encoding.encode(text, allowed_special="all")
        return self._prefix_ids + ids if add_special_tokens else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens:
            ids = [token_id for token_id in ids if token_id not in self.all_special_ids]
        return self._encoding.decode_bytes(list(ids)).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        added = self._added_by_id.get(token_id)
        if added is not None:
            return added.encode("utf-8")
        return self._encoding.decode_single_token_bytes(token_id)

    def id_to_token(self, token_id: int) -> str | None:
        added = self._added_by_id.get(token_id)
        if added is not None:
            return added
        try:
            return bytes_to_token_text(self._encoding.decode_single_token_bytes(token_id))
        except KeyError:
            return None

    def token_to_id(self, token: str) -> int | None:
        added = self._added_by_text.get(token)
        if added is not None:
            return added
        if self._id_by_text is None:
            self._id_by_text = {bytes_to_token_text(data): rank for data, rank in self._ranks.items()}
        return self._id_by_text.get(token)

    def new_decode_stream(self, skip_special_tokens: bool = True) -> _Utf8DecodeStream:
        return _Utf8DecodeStream(self, skip_special_tokens)


def load_tiktoken_tokenizer(folder: str) -> TiktokenTokenizer:
    path = find_tiktoken_file(folder)
    if path is None:
        raise FileNotFoundError(f"{folder} has no tiktoken-format tokenizer.model or *.tiktoken file")
    config = read_tokenizer_config(folder)
    model_type = _read_model_type(folder)
    pattern = PATTERNS_BY_MODEL_TYPE.get(model_type or "")
    if pattern is None:
        raise ValueError(
            f"{folder}/config.json model_type {model_type!r}: no known split regex for its tiktoken file "
            f"(known: {', '.join(sorted(PATTERNS_BY_MODEL_TYPE))})"
        )
    ranks = read_tiktoken_ranks(path)
    added_tokens: dict[str, int] = {}
    special_ids: set[int] = set()
    for token_id_text, entry in (config.get("added_tokens_decoder") or {}).items():
        content = entry.get("content") if isinstance(entry, dict) else None
        if not isinstance(content, str) or content.encode("utf-8") in ranks:
            continue
        added_tokens[content] = int(token_id_text)
        if entry.get("special", True):
            special_ids.add(int(token_id_text))
    taken = set(ranks.values()) & set(added_tokens.values())
    if taken:
        raise ValueError(f"{folder}/tokenizer_config.json: added token ids {sorted(taken)[:5]} collide with {path}")
    encoding = tiktoken.Encoding(name=os.path.basename(folder.rstrip("/")) or "model", pat_str=pattern,
                                 mergeable_ranks=ranks, special_tokens=added_tokens)
    bos_token = special_token_text(config, "bos_token")
    return TiktokenTokenizer(
        encoding, ranks, added_tokens,
        special_ids=frozenset(special_ids),
        bos_token=bos_token,
        eos_token=special_token_text(config, "eos_token"),
        pad_token=special_token_text(config, "pad_token"),
        unk_token=special_token_text(config, "unk_token"),
        add_bos_token=bool(config.get("add_bos_token", bos_token is not None)),
        extra_eos_token_ids=read_eos_token_ids(folder),
        chat_templates=read_chat_templates(folder, config),
    )


def _read_model_type(folder: str) -> str | None:
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as file:
        value = json.load(file).get("model_type")
    return value if isinstance(value, str) else None
