"""The tokenizer.json backend against transformers' fast tokenizer on the same files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from tokenizers import decoders, pre_tokenizers, processors

from engine.model.resolve import resolve_model
from engine.model.tokenizer import Tokenizer, load_tokenizer
from engine.model.tokenizer_hf import HFTokenizer

# A ChatML template with tools, tool calls and tool results, written for this test in the style
# of current instruct models (namespace, loop.last, tojson, raise_exception, strftime_now).
CHAT_TEMPLATE = """\
{%- set ns = namespace(system=none) -%}
{%- if messages[0].role == 'system' -%}{%- set ns.system = messages[0].content -%}{%- endif -%}
{{- '<|im_start|>system\\n' + (ns.system if ns.system is not none else 'You are a helpful assistant.') }}
{%- if tools %}

# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
{%- endif %}
{{- '<|im_end|>\\n' }}
{%- for message in messages -%}
  {%- if message.role == 'system' -%}
    {%- if not loop.first -%}{{ raise_exception('system message must come first') }}{%- endif -%}
  {%- elif message.role == 'user' -%}
{{ '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
  {%- elif message.role == 'assistant' -%}
{{ '<|im_start|>assistant\\n' }}{% if message.content %}{{ message.content }}{% endif %}
    {%- for call in message.tool_calls | default([]) %}
<tool_call>
{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson(indent=2) }}
</tool_call>
    {%- endfor %}
{{- '<|im_end|>\\n' }}
  {%- elif message.role == 'tool' -%}
{{ '<|im_start|>tool\\n' + message.content + '<|im_end|>\\n' }}
  {%- else -%}
{{ raise_exception('unknown role ' + message.role) }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}
"""

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city — «any» city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You answer in one line."},
    {"role": "user", "content": "Weather in Paris? 😀"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "{\"temp_c\": 21}"},
    {"role": "assistant", "content": "21 °C, sunny."},
    {"role": "user", "content": "And tomorrow?"},
]

_CORPUS = [
    "The weather in Paris is sunny with 21 degrees. Tomorrow it will rain.",
    "def get_weather(city):\n    return {'temp_c': 21}\n",
    "You are a helpful assistant. You answer in one line.",
    "日本語 😀 naïve café 12345 3.14",
] * 4


def _write_folder(folder: Path, *, template_in: str = "tokenizer_config") -> Path:
    model = tokenizers.Tokenizer(tokenizers.models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    model.decoder = decoders.ByteLevel()
    model.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=600, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    )
    model.train_from_iterator(_CORPUS, trainer=trainer)
    model.add_tokens([tokenizers.AddedToken("<tool_call>", special=False, normalized=False),
                      tokenizers.AddedToken("</tool_call>", special=False, normalized=False)])
    folder.mkdir(exist_ok=True)
    model.save(str(folder / "tokenizer.json"))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False, "normalized": False,
                      "rstrip": False, "single_word": False, "special": True},
        "pad_token": "<|endoftext|>",
        "clean_up_tokenization_spaces": False,
    }
    if template_in == "tokenizer_config":
        config["chat_template"] = CHAT_TEMPLATE
    elif template_in == "jinja":
        (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")
        config["chat_template"] = "{{ 'overridden by chat_template.jinja' }}"
    elif template_in == "json":
        (folder / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "eos_token_id": 2}), encoding="utf-8")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_folder(tmp_path_factory.mktemp("hf") / "model")


@pytest.fixture(scope="module")
def ours(folder: Path) -> Tokenizer:
    return load_tokenizer(resolve_model(str(folder)))


@pytest.fixture(scope="module")
def theirs(folder: Path):
    transformers = pytest.importorskip("transformers")
    # The generic fast tokenizer: AutoTokenizer would pick transformers' Qwen2 class from config.json,
    # which rebuilds the pipeline from its own defaults instead of reading tokenizer.json.
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(folder))


TEXTS = ["Weather in Paris? 😀", "def f():\n    return 21\n", "<|im_start|>user\nhi<|im_end|>\n<tool_call>{}</tool_call>",
         "日本語 naïve 12345   x", "", "  spaces  "]


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(ours: Tokenizer, theirs, text: str) -> None:
    ids = ours.encode(text)
    assert ids == theirs.encode(text, add_special_tokens=False)
    assert ours.encode(text, add_special_tokens=True) == theirs.encode(text, add_special_tokens=True)
    for skip in (True, False):
        assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert ours.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("with_tools", [True, False])
def test_chat_template_matches_transformers(ours: Tokenizer, theirs, add_generation_prompt: bool,
                                            with_tools: bool) -> None:
    tools = TOOLS if with_tools else None
    rendered = ours.apply_chat_template(CONVERSATION, tools=tools, add_generation_prompt=add_generation_prompt)
    expected = theirs.apply_chat_template(CONVERSATION, tools=tools, add_generation_prompt=add_generation_prompt,
                                          tokenize=False)
    assert rendered == expected
    assert ("«any»" in rendered) == with_tools  # tojson keeps non-ASCII
    assert '"arguments": {\n    "city": "Paris"\n  }' in rendered  # tojson(indent=2)
    assert ours.encode(rendered) == theirs.encode(expected, add_special_tokens=False)


def test_special_tokens_and_eos_ids(ours: Tokenizer, theirs) -> None:
    assert isinstance(ours, HFTokenizer)
    assert ours.vocab_size == len(theirs)
    assert ours.bos_token is None and ours.bos_token_id is None
    assert (ours.eos_token, ours.eos_token_id) == ("<|im_end|>", 2) == (theirs.eos_token, theirs.eos_token_id)
    assert ours.pad_token_id == theirs.pad_token_id == 0
    # <|im_end|> from the config, <|endoftext|> (0) from generation_config.json and as a known end of turn.
    assert ours.eos_token_ids == frozenset({0, 2})
    assert ours.all_special_ids == frozenset({0, 1, 2})  # not the user-defined <tool_call> tokens
    tool_call_id = ours.token_to_id("<tool_call>")
    assert tool_call_id is not None and ours.decode([tool_call_id]) == "<tool_call>"
    assert ours.chat_template == CHAT_TEMPLATE


@pytest.mark.parametrize("template_in", ["jinja", "json"])
def test_template_files_take_precedence(tmp_path: Path, template_in: str) -> None:
    tokenizer = load_tokenizer(resolve_model(str(_write_folder(tmp_path / "m", template_in=template_in))))
    assert tokenizer.chat_template == CHAT_TEMPLATE


def test_named_templates_prefer_tool_use_with_tools(tmp_path: Path) -> None:
    folder = _write_folder(tmp_path / "m")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": "plain"},
                               {"name": "tool_use", "template": "tools={{ tools | length }}"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(resolve_model(str(folder)))
    messages = [{"role": "user", "content": "x"}]
    assert tokenizer.apply_chat_template(messages) == "plain"
    assert tokenizer.apply_chat_template(messages, tools=TOOLS) == "tools=1"


def test_added_tokens_missing_from_tokenizer_json_are_added(tmp_path: Path) -> None:
    folder = _write_folder(tmp_path / "m")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    vocab_size = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"].__len__() + 2
    config["added_tokens_decoder"] = {str(vocab_size): {"content": "<|think|>", "special": True}}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(resolve_model(str(folder)))
    assert tokenizer.encode("a<|think|>b")[1] == vocab_size
    assert vocab_size in tokenizer.all_special_ids


def test_folders_without_a_usable_tokenizer_raise(tmp_path: Path) -> None:
    folder = tmp_path / "spm"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "tokenizer.model").write_bytes(b"\n\x0e\n\x05<unk>\x15\x00\x00\x00\x00\x18\x02")  # SentencePiece protobuf
    with pytest.raises(ValueError, match="no tokenizer.json and no tiktoken-format"):
        load_tokenizer(resolve_model(str(folder)))
    (folder / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer.json"):
        load_tokenizer(resolve_model(str(folder)))
