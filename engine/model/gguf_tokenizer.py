"""A tokenizer built from a GGUF file's metadata (tokenizer.ggml.*), the way llama.cpp reads it.

Only byte-level BPE ("gpt2" model) is supported: GGUF stores its vocabulary as the byte-level
strings of a Hugging Face tokenizer.json ("Ġthe"), its merges as "a b" strings, and a token type
per id. We rebuild a `tokenizers.Tokenizer` from them:
- pre-tokenizer: chosen by tokenizer.ggml.pre, which names the model family's split regex;
- control (3) and user-defined (4) tokens become added tokens, so "<|im_start|>" written by a chat
  template encodes to its id; control tokens are special (skipped when decoding with
  skip_special_tokens), user-defined ones are not;
- bos/eos/padding/unknown ids, add_bos_token/add_eos_token and tokenizer.chat_template.

The metadata is read by a small parser of the GGUF key-value section instead of gguf.GGUFReader:
the reader builds numpy views for every string of the vocabulary and takes about 4 s on the
embedded model, where walking the header directly takes a few tens of milliseconds.
"""

from __future__ import annotations

import logging
import mmap
import struct
from collections.abc import Sequence
from typing import Any

import tokenizers
from gguf import GGUFValueType
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from engine.model.tokenizer import LLAMA3_SPLIT_PATTERN, QWEN2_SPLIT_PATTERN
from engine.model.tokenizer_hf import HFTokenizer

logger = logging.getLogger(__name__)

# GGUF token types (llama.cpp's llama_token_type).
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# tokenizer.ggml.pre names (llama.cpp's) by split rule. llama.cpp's "default" is not GPT-2's rule.
_GPT2_FAMILY = {"gpt2"}
_DIGITS_THEN_GPT2_FAMILY = {"smollm", "starcoder", "refact"}  # every digit its own piece, then GPT-2's regex
_LLAMA3_FAMILY = {"llama-bpe", "llama3", "llama-v3"}
_QWEN2_FAMILY = {"qwen2"}
SUPPORTED_PRE_TOKENIZERS = frozenset(_GPT2_FAMILY | _DIGITS_THEN_GPT2_FAMILY | _LLAMA3_FAMILY | _QWEN2_FAMILY)

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


def read_gguf_metadata(path: str) -> dict[str, Any]:
    """All key-value metadata of a GGUF file (arrays as lists); tensor data is never touched."""
    try:
        with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            return _parse_metadata(buffer, path)
    except (struct.error, UnicodeDecodeError, IndexError) as exc:
        raise ValueError(f"{path}: truncated or corrupt GGUF metadata ({exc})") from None


def _parse_metadata(buffer: mmap.mmap, path: str) -> dict[str, Any]:
    if buffer[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file (bad magic)")
    (version,) = struct.unpack_from("<I", buffer, 4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (need 2 or 3, little-endian)")
    _num_tensors, num_kv = struct.unpack_from("<QQ", buffer, 8)
    offset = 24
    metadata: dict[str, Any] = {}
    for _ in range(num_kv):
        key, offset = _read_string(buffer, offset)
        (value_type,) = struct.unpack_from("<I", buffer, offset)
        metadata[key], offset = _read_value(buffer, offset + 4, GGUFValueType(value_type))
    return metadata


def _read_string(buffer: mmap.mmap, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buffer, offset)
    start = offset + 8
    return buffer[start:start + length].decode("utf-8"), start + length


def _read_value(buffer: mmap.mmap, offset: int, value_type: GGUFValueType) -> tuple[Any, int]:
    if value_type == GGUFValueType.STRING:
        return _read_string(buffer, offset)
    if value_type == GGUFValueType.ARRAY:
        item_type, count = struct.unpack_from("<IQ", buffer, offset)
        offset += 12
        item_type = GGUFValueType(item_type)
        if item_type in _SCALAR_FORMATS:
            # Fixed-size items: one unpack for the whole array.
            fmt = _SCALAR_FORMATS[item_type]
            values = list(struct.unpack_from(f"<{count}{fmt[1]}", buffer, offset))
            return values, offset + count * struct.calcsize(fmt)
        items = []
        for _ in range(count):
            item, offset = _read_value(buffer, offset, item_type)
            items.append(item)
        return items, offset
    fmt = _SCALAR_FORMATS[value_type]
    (value,) = struct.unpack_from(fmt, buffer, offset)
    return value, offset + struct.calcsize(fmt)


def load_gguf_tokenizer(path: str) -> HFTokenizer:
    """The tokenizer described by a GGUF file's metadata."""
    return build_gguf_tokenizer(read_gguf_metadata(path), source=path)


def build_gguf_tokenizer(metadata: dict[str, Any], source: str = "GGUF file") -> HFTokenizer:
    """Builds the tokenizer from already-read metadata (see read_gguf_metadata)."""
    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        kind = {"llama": "SentencePiece", "bert": "WordPiece", "t5": "Unigram"}.get(str(model), "unknown")
        raise ValueError(
            f"{source}: tokenizer.ggml.model is {model!r} ({kind}); only 'gpt2' (byte-level BPE) GGUF tokenizers "
            "are supported: use the model's Hugging Face folder (tokenizer.json) instead"
        )
    tokens: list[str] = _required(metadata, "tokenizer.ggml.tokens", source)
    merges_text: list[str] = _required(metadata, "tokenizer.ggml.merges", source)
    token_types: list[int] = metadata.get("tokenizer.ggml.token_type") or [TOKEN_TYPE_NORMAL] * len(tokens)
    if len(token_types) != len(tokens):
        raise ValueError(f"{source}: tokenizer.ggml.token_type has {len(token_types)} entries for {len(tokens)} tokens")
    pre = metadata.get("tokenizer.ggml.pre")
    if pre is None:
        logger.warning("%s has no tokenizer.ggml.pre; using GPT-2's pre-tokenizer", source)
        pre = "gpt2"
    if pre not in SUPPORTED_PRE_TOKENIZERS:
        raise ValueError(
            f"{source}: tokenizer.ggml.pre {pre!r} is not supported (supported: {', '.join(sorted(SUPPORTED_PRE_TOKENIZERS))})"
        )

    vocab: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        vocab.setdefault(token, token_id)  # a duplicated string keeps its first id, as llama.cpp does
    merges = [tuple(merge.split(" ", 1)) for merge in merges_text]
    # Llama 3 looks a whole pre-token up in the vocabulary before merging (tiktoken's rule).
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in _LLAMA3_FAMILY)
    tokenizer = tokenizers.Tokenizer(bpe)
    tokenizer.pre_tokenizer = _pre_tokenizer(pre)
    if pre in _QWEN2_FAMILY:
        tokenizer.normalizer = normalizers.NFC()
    tokenizer.decoder = decoders.ByteLevel()

    special = [tokenizers.AddedToken(tokens[i], special=True, normalized=False)
               for i, kind in enumerate(token_types) if kind == TOKEN_TYPE_CONTROL]
    user_defined = [tokenizers.AddedToken(tokens[i], special=False, normalized=False)
                    for i, kind in enumerate(token_types) if kind == TOKEN_TYPE_USER_DEFINED]
    tokenizer.add_special_tokens(special)
    tokenizer.add_tokens(user_defined)

    def token_at(key: str) -> str | None:
        token_id = metadata.get(key)
        return tokens[token_id] if isinstance(token_id, int) and 0 <= token_id < len(tokens) else None

    bos_token = token_at("tokenizer.ggml.bos_token_id")
    eos_token = token_at("tokenizer.ggml.eos_token_id")
    # Llama 3 GGUFs written before the key existed still expect their <|begin_of_text|>.
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", pre in _LLAMA3_FAMILY))
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    tokenizer.post_processor = _post_processor(
        bos_token if add_bos else None, eos_token if add_eos else None, vocab)

    extra_eos_ids = [metadata[key] for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
                     if isinstance(metadata.get(key), int)]
    template = metadata.get("tokenizer.chat_template")
    return HFTokenizer(
        tokenizer,
        bos_token=bos_token,
        eos_token=eos_token,
        pad_token=token_at("tokenizer.ggml.padding_token_id"),
        unk_token=token_at("tokenizer.ggml.unknown_token_id"),
        extra_eos_token_ids=extra_eos_ids,
        chat_templates={"default": template} if isinstance(template, str) else {},
    )


def _required(metadata: dict[str, Any], key: str, source: str) -> list[Any]:
    value = metadata.get(key)
    if not isinstance(value, list) or not value:
        raise ValueError(f"{source}: GGUF metadata lacks {key}")
    return value


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    if pre in _GPT2_FAMILY:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_THEN_GPT2_FAMILY:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    pattern = LLAMA3_SPLIT_PATTERN if pre in _LLAMA3_FAMILY else QWEN2_SPLIT_PATTERN
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


def _post_processor(bos_token: str | None, eos_token: str | None,
                    vocab: dict[str, int]) -> processors.PostProcessor:
    # ByteLevel(trim_offsets) alone when nothing is added, like GPT-2's tokenizer.json.
    if bos_token is None and eos_token is None:
        return processors.ByteLevel(trim_offsets=False)
    single: Sequence[str] = [*([f"{bos_token}:0"] if bos_token else []), "$A:0", *([f"{eos_token}:0"] if eos_token else [])]
    pair: Sequence[str] = [*single, *([f"{bos_token}:1"] if bos_token else []), "$B:1",
                           *([f"{eos_token}:1"] if eos_token else [])]
    special = {token: vocab[token] for token in (bos_token, eos_token) if token}
    return processors.TemplateProcessing(single=list(single), pair=list(pair), special_tokens=list(special.items()))
