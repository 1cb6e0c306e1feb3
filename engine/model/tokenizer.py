"""The tokenizer contract used by the engine and the gateway, and the one way to load one.

Three backends sit behind the same `Tokenizer` protocol:
- tokenizer_hf.py: the Hugging Face `tokenizers` library, from a checkpoint folder's
  tokenizer.json + tokenizer_config.json (+ chat_template.jinja / chat_template.json,
  generation_config.json);
- gguf_tokenizer.py: a byte-level BPE `tokenizers.Tokenizer` built from GGUF metadata (the
  embedded SmolLM2 model), wrapped by the same class as above;
- tokenizer_tiktoken.py: `tiktoken`, for folders that ship a tiktoken-format BPE file (Llama-3's
  original tokenizer.model) instead of tokenizer.json.

This module imports no torch: the gateway process tokenizes and renders chat templates too.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from engine.model.chat_template import render_chat_template

if TYPE_CHECKING:
    from engine.model.resolve import ResolvedModel

# Special tokens that end a turn in the chat formats we know. When one of them is a special token
# of the vocabulary it joins eos_token_ids even if the config names another eos: an instruct model
# that emits <|im_end|> or <|eot_id|> is done, whatever its base model's eos was (llama.cpp does
# the same). Only tokens the vocabulary marks as special qualify, never ordinary text.
END_OF_TURN_TOKENS = frozenset({
    "<|im_end|>",  # ChatML: Qwen, SmolLM, ...
    "<|endoftext|>",  # GPT-2 style end of document (SmolLM, Qwen base)
    "<|eot_id|>",  # Llama 3 end of turn
    "<|eom_id|>",  # Llama 3.1 end of message (tool call follows)
    "<|end_of_text|>",  # Llama 3 end of document
    "<end_of_turn>",  # Gemma
    "<|end|>",  # Phi-3
    "</s>",  # Llama 2, Mistral
})

# Split (pre-tokenization) regexes of the byte-level BPE families, as their tokenizer.json files
# and tiktoken setups spell them. GPT-2's own pattern is built into tokenizers' ByteLevel.
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN2_SPLIT_PATTERN = (  # as Llama 3's, but every digit is its own piece
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


class DecodeStream(Protocol):
    """Incremental decoding of one sequence of generated tokens.

    `step(ids)` appends token ids (an int or a list) and returns the text they complete, or None
    while the text so far would end inside a character (a multi-byte UTF-8 sequence split across
    tokens) or the tokens add no text (e.g. a skipped special token). Concatenating every returned
    piece gives a prefix of `tokenizer.decode(all_ids)`; the held-back rest is at most a few bytes.
    """

    def step(self, token_ids: int | Sequence[int]) -> str | None: ...


@runtime_checkable
class Tokenizer(Protocol):
    """What the engine and the gateway need from a tokenizer.

    Token ids are plain ints in [0, vocab_size). `encode` recognises added/special tokens written
    in the text (so a rendered chat template's "<|im_start|>" becomes its id), as Hugging Face
    does; `add_special_tokens` adds what the model's post-processor adds to a raw prompt (a BOS
    for Llama-family models, nothing for ChatML models). `eos_token_ids` holds every id that ends
    a generation: the configured eos, generation_config.json's eos list, and known end-of-turn
    special tokens present in the vocabulary.
    """

    vocab_size: int
    bos_token: str | None
    bos_token_id: int | None
    eos_token: str | None
    eos_token_id: int | None
    eos_token_ids: frozenset[int]
    pad_token_id: int | None
    all_special_ids: frozenset[int]
    chat_template: str | None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def id_to_token(self, token_id: int) -> str | None: ...

    def token_to_id(self, token: str) -> int | None: ...

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
                            add_generation_prompt: bool = True, **kwargs: Any) -> str: ...

    def new_decode_stream(self, skip_special_tokens: bool = True) -> DecodeStream: ...


class TokenizerBase(ABC):
    """The parts every backend shares: special-token bookkeeping and chat-template rendering.

    Subclasses set the attributes below in their constructor (through `_init_special_tokens`) and
    implement the encoding methods.
    """

    vocab_size: int
    bos_token: str | None
    bos_token_id: int | None
    eos_token: str | None
    eos_token_id: int | None
    eos_token_ids: frozenset[int]
    pad_token: str | None
    pad_token_id: int | None
    unk_token: str | None
    all_special_ids: frozenset[int]
    chat_template: str | None
    # Named alternatives from tokenizer_config.json's list form, e.g. {"tool_use": ...}.
    chat_templates: dict[str, str]

    def _init_special_tokens(
        self,
        *,
        bos_token: str | None,
        eos_token: str | None,
        pad_token: str | None,
        unk_token: str | None,
        extra_eos_token_ids: Iterable[int],
        special_ids: Iterable[int],
        chat_templates: Mapping[str, str],
    ) -> None:
        self.all_special_ids = frozenset(special_ids)
        self.bos_token, self.bos_token_id = bos_token, self._id_or_none(bos_token)
        self.eos_token, self.eos_token_id = eos_token, self._id_or_none(eos_token)
        self.pad_token, self.pad_token_id = pad_token, self._id_or_none(pad_token)
        self.unk_token = unk_token
        eos_ids = {token_id for token_id in extra_eos_token_ids if 0 <= token_id < self.vocab_size}
        if self.eos_token_id is not None:
            eos_ids.add(self.eos_token_id)
        for token in END_OF_TURN_TOKENS:
            token_id = self.token_to_id(token)
            if token_id is not None and token_id in self.all_special_ids:
                eos_ids.add(token_id)
        self.eos_token_ids = frozenset(eos_ids)
        self.chat_templates = dict(chat_templates)
        self.chat_template = self.chat_templates.get("default")

    def _id_or_none(self, token: str | None) -> int | None:
        return None if token is None else self.token_to_id(token)

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    @abstractmethod
    def id_to_token(self, token_id: int) -> str | None: ...

    @abstractmethod
    def token_to_id(self, token: str) -> int | None: ...

    @abstractmethod
    def new_decode_stream(self, skip_special_tokens: bool = True) -> DecodeStream: ...

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Renders the conversation with the model's template (see chat_template.py for the rules).

        `chat_template=` in kwargs overrides the model's template. With tools, a template named
        "tool_use" is preferred when the model ships one, as Hugging Face does.
        """
        template = kwargs.pop("chat_template", None)
        if template is None and tools and "tool_use" in self.chat_templates:
            template = self.chat_templates["tool_use"]
        if template is None:
            template = self.chat_template
        if template is None:
            raise ValueError("this model has no chat template: use the completions API with a raw prompt")
        special_tokens = {"bos_token": self.bos_token, "eos_token": self.eos_token,
                          "pad_token": self.pad_token, "unk_token": self.unk_token}
        return render_chat_template(template, messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                    special_tokens=special_tokens, **kwargs)


def load_tokenizer(resolved: ResolvedModel | None) -> TokenizerBase:
    """The tokenizer of a resolved model; None means the embedded GGUF model.

    A GGUF file gets a tokenizer built from its metadata; a checkpoint folder uses tokenizer.json
    when present, else a tiktoken-format tokenizer.model / *.tiktoken file. Anything else (e.g. a
    SentencePiece-only folder or GGUF) raises ValueError naming what was found.
    """
    if resolved is None:
        from engine.model.resolve import resolve_model

        resolved = resolve_model(None)
    if resolved.format == "gguf":
        from engine.model.gguf_tokenizer import load_gguf_tokenizer

        return load_gguf_tokenizer(resolved.path)
    if resolved.format != "hf":
        raise ValueError(f"unknown model format {resolved.format!r} (expected 'gguf' or 'hf')")
    if os.path.isfile(os.path.join(resolved.path, "tokenizer.json")):
        from engine.model.tokenizer_hf import load_hf_tokenizer

        return load_hf_tokenizer(resolved.path)
    from engine.model.tokenizer_tiktoken import find_tiktoken_file, load_tiktoken_tokenizer

    if find_tiktoken_file(resolved.path) is not None:
        return load_tiktoken_tokenizer(resolved.path)
    present = sorted(name for name in os.listdir(resolved.path) if "token" in name)
    raise ValueError(
        f"model folder {resolved.path!r} has no tokenizer.json and no tiktoken-format tokenizer file "
        f"(found: {', '.join(present) or 'no tokenizer files'}); SentencePiece-only tokenizers are not supported"
    )
