"""The GGUF tokenizer against independent references.

- The embedded SmolLM2 GGUF against transformers' own GGUF-to-tokenizer conversion.
- Small GGUF files written here with gguf.GGUFWriter: the Llama 3 and Qwen2 pre-tokenizers against
  tiktoken running the same ranks with the families' published split patterns.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import pytest
import tiktoken
import tokenizers
from tiktoken_ext.openai_public import r50k_pat_str
from tokenizers import pre_tokenizers

from engine.model.gguf_tokenizer import load_gguf_tokenizer, read_gguf_metadata
from engine.model.resolve import ResolvedModel, embedded_gguf_path
from engine.model.tokenizer import Tokenizer, load_tokenizer

TEXTS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # recursion\n",
    "12345",
    "x = 3.14159; y = 2024-11-29 and 1,000,000",
    "a   1 and b\t\t22\n\n333",
    "   leading, trailing   ",
    "\n\n\n\ttabs\tand\r\nCRLF\r\n",
    "It's, I'm, we'll, they've, she'd, YOU'RE",
    "naïve café déjà vu — «quotes» ½",
    "日本語のテキスト、中文文本，한국어",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "code: {\"key\": [1, 2, {\"nested\": null}]} <repo_name>x<file_sep>",
    "",
    " ",
]


@pytest.fixture(scope="module")
def embedded() -> Tokenizer:
    return load_tokenizer(None)


@pytest.fixture(scope="module")
def reference():  # a transformers tokenizer converted from the same GGUF file
    transformers = pytest.importorskip("transformers")
    path = embedded_gguf_path()
    converted = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    # transformers' converter gives every "gpt2" GGUF GPT-2's regex; SmolLM2's published
    # tokenizer.json (and llama.cpp's "smollm" pre-tokenizer) first isolates every digit.
    converted.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    return converted


@pytest.mark.parametrize("text", TEXTS)
def test_embedded_encode_matches_transformers(embedded: Tokenizer, reference, text: str) -> None:
    assert embedded.encode(text) == reference.encode(text, add_special_tokens=False)
    assert embedded.encode(text, add_special_tokens=True) == reference.encode(text, add_special_tokens=True)


@pytest.mark.parametrize("text", TEXTS)
def test_embedded_decode_round_trips(embedded: Tokenizer, reference, text: str) -> None:
    ids = embedded.encode(text)
    assert embedded.decode(ids, skip_special_tokens=False) == text
    assert embedded.decode(ids, skip_special_tokens=True) == reference.decode(ids, skip_special_tokens=True)


def test_smollm_isolates_digits_after_whitespace_runs(embedded: Tokenizer) -> None:
    # With GPT-2's regex alone "a   1" splits as "a", "  ", " 1"; SmolLM2 splits the digit off
    # first, so the three spaces stay one piece.
    ids = embedded.encode("a   1")
    assert [embedded.id_to_token(i) for i in ids] == ["a", "ĠĠĠ", "1"]
    assert [embedded.id_to_token(i) for i in embedded.encode("12345")] == ["1", "2", "3", "4", "5"]


def test_embedded_special_tokens(embedded: Tokenizer, reference) -> None:
    assert embedded.vocab_size == 49152 == len(reference)
    assert (embedded.bos_token, embedded.bos_token_id) == ("<|im_start|>", 1) == (reference.bos_token, reference.bos_token_id)
    assert (embedded.eos_token, embedded.eos_token_id) == ("<|im_end|>", 2) == (reference.eos_token, reference.eos_token_id)
    assert embedded.pad_token_id == reference.pad_token_id == 2
    # <|im_end|> is the configured eos; <|endoftext|> (id 0) also ends a generation.
    assert embedded.eos_token_ids == frozenset({0, 2})
    assert embedded.all_special_ids == frozenset(range(17))  # the 17 control tokens
    assert embedded.encode("<|im_start|><repo_name><empty_output>") == [1, 3, 16]
    assert embedded.decode([1, 3, 16, 19556], skip_special_tokens=True) == "Hello"
    assert embedded.token_to_id("<|im_end|>") == 2 and embedded.id_to_token(2) == "<|im_end|>"
    assert embedded.id_to_token(19556) == reference.convert_ids_to_tokens(19556)
    assert embedded.token_to_id("no such token") is None
    assert embedded.chat_template == reference.chat_template


def test_embedded_chat_template_matches_transformers(embedded: Tokenizer, reference) -> None:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Count to 3."},
    ]
    for add_generation_prompt in (True, False):
        ours = embedded.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        theirs = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert ours == theirs
        assert embedded.encode(ours) == reference.encode(theirs, add_special_tokens=False)


def test_load_tokenizer_accepts_a_resolved_gguf(embedded: Tokenizer) -> None:
    loaded = load_tokenizer(ResolvedModel(embedded_gguf_path(), "gguf", "x"))
    assert loaded.encode(TEXTS[2]) == embedded.encode(TEXTS[2])


def test_metadata_reader_matches_gguf_reader(tmp_path: Path) -> None:
    path = tmp_path / "meta.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_uint8("t.u8", 200)
    writer.add_int8("t.i8", -5)
    writer.add_uint16("t.u16", 60000)
    writer.add_int16("t.i16", -30000)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_uint64("t.u64", 2**63 + 5)
    writer.add_int64("t.i64", -(2**62))
    writer.add_float32("t.f32", 1.5)
    writer.add_float64("t.f64", -2.25)
    writer.add_bool("t.bool", True)
    writer.add_string("t.str", "héllo 😀")
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, 1.25])
    writer.add_array("t.strs", ["a", "", "Ġthe", "<|im_end|>"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ours = read_gguf_metadata(str(path))
    fields = gguf.GGUFReader(str(path)).fields
    for key in [k for k in fields if k.startswith("t.")]:
        assert ours[key] == fields[key].contents(), key
    assert ours["general.architecture"] == "llama"


# ---- small synthetic GGUF files ------------------------------------------------------------

_CORPUS = [text for text in TEXTS if text] * 3 + [
    "the then there these those theory thermal; in on an and at as is it its",
    "print(value) return value\n    if x:\n        pass\n",
    "1234567890 9876543210 2024 1999 42",
]
# cl100k_base's pattern as tiktoken ships it; Llama 3 adopted the cl100k split rules.
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
# Qwen's tokenization_qwen.py PAT_STR.
_QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]


def _train_byte_level_ranks() -> dict[bytes, int]:
    """Byte-level BPE ranks (id = rank) learnt on a small corpus: all 256 bytes, then merges."""
    model = tokenizers.Tokenizer(tokenizers.models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                             show_progress=False)
    model.train_from_iterator(_CORPUS, trainer=trainer)
    decode_table = {char: byte for byte, char in enumerate(_byte_level_chars())}
    vocab = sorted(model.get_vocab().items(), key=lambda item: item[1])
    return {bytes(decode_table[c] for c in token): rank for rank, (token, _) in enumerate(vocab)}


def _byte_level_chars() -> list[str]:
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 256
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    # Every split of a token into two tokens of the vocabulary is a merge, ordered by the rank of
    # the result: the same conversion that produced Llama 3's tokenizer.json from its tiktoken file.
    merges = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    return [(left, right) for *_, left, right in sorted(merges)]


def _write_bpe_gguf(path: Path, ranks: dict[bytes, int], pre: str | None, *, model: str = "gpt2",
                    add_bos: bool | None = None) -> None:
    table = _byte_level_chars()
    as_text = lambda data: "".join(table[b] for b in data)  # noqa: E731
    tokens = [as_text(data) for data, _ in sorted(ranks.items(), key=lambda item: item[1])] + _SPECIALS
    types = [1] * len(ranks) + [3] * len(_SPECIALS)
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{as_text(left)} {as_text(right)}" for left, right in _merges_from_ranks(ranks)])
    writer.add_bos_token_id(len(ranks))
    writer.add_eos_token_id(len(ranks) + 2)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize(("pre", "pattern"), [
    ("llama-bpe", _CL100K_PATTERN),
    ("qwen2", _QWEN_PATTERN),
    ("gpt2", r50k_pat_str),  # GPT-2's pattern as tiktoken ships it
    (None, r50k_pat_str),  # files older than the key: GPT-2's rule, as transformers assumes
])
def test_gguf_pre_tokenizers_match_tiktoken(tmp_path: Path, pre: str | None, pattern: str) -> None:
    ranks = _train_byte_level_ranks()
    if pre == "llama-bpe":
        # A token no merge reaches: tiktoken (and Llama 3's ignore_merges) still uses it whole.
        ranks[b" zqxj"] = len(ranks)
    path = tmp_path / f"{pre}.gguf"
    _write_bpe_gguf(path, ranks, pre)
    ours = load_gguf_tokenizer(str(path))
    specials = {token: len(ranks) + i for i, token in enumerate(_SPECIALS)}
    reference = tiktoken.Encoding(name=pre, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    texts = [t for t in TEXTS if "<|im_" not in t] + ["<|begin_of_text|>hi<|eot_id|>", "1234567 89", "x\n\n  \n y", "a zqxj"]
    for text in texts:
        # Qwen2 NFC-normalises first; our texts are NFC already, so tiktoken sees the same input.
        assert ours.encode(text) == reference.encode(text, allowed_special="all"), text
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == text
    # A Llama 3 GGUF without the key still adds <|begin_of_text|>; Qwen2 adds nothing.
    with_bos = ours.encode("hi", add_special_tokens=True)
    assert with_bos == ([specials["<|begin_of_text|>"]] if pre == "llama-bpe" else []) + ours.encode("hi")
    assert ours.eos_token_id == specials["<|eot_id|>"]
    assert ours.eos_token_ids == frozenset({specials["<|eot_id|>"], specials["<|end_of_text|>"]})


def test_gguf_add_bos_token_key_is_honoured(tmp_path: Path) -> None:
    ranks = _train_byte_level_ranks()
    _write_bpe_gguf(tmp_path / "bos.gguf", ranks, "qwen2", add_bos=True)
    tokenizer = load_gguf_tokenizer(str(tmp_path / "bos.gguf"))
    assert tokenizer.encode("hi", add_special_tokens=True)[0] == tokenizer.bos_token_id == len(ranks)


def test_gguf_unsupported_formats_raise(tmp_path: Path) -> None:
    ranks = _train_byte_level_ranks()
    _write_bpe_gguf(tmp_path / "spm.gguf", ranks, "default", model="llama")
    with pytest.raises(ValueError, match="SentencePiece"):
        load_gguf_tokenizer(str(tmp_path / "spm.gguf"))
    _write_bpe_gguf(tmp_path / "odd.gguf", ranks, "some-new-family")
    with pytest.raises(ValueError, match="tokenizer.ggml.pre 'some-new-family'"):
        load_gguf_tokenizer(str(tmp_path / "odd.gguf"))
    (tmp_path / "not.gguf").write_bytes(b"NOPE" + bytes(40))
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_gguf_tokenizer(str(tmp_path / "not.gguf"))
