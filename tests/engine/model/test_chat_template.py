"""Chat template rendering: the embedded model's template, the helpers, the sandbox and errors."""

from __future__ import annotations

from datetime import datetime

import pytest

from engine.model.chat_template import compile_chat_template, render_chat_template
from engine.model.tokenizer import Tokenizer, load_tokenizer


@pytest.fixture(scope="module")
def embedded() -> Tokenizer:
    return load_tokenizer(None)


def test_embedded_template_two_turn_chat(embedded: Tokenizer) -> None:
    messages = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
    ]
    assert embedded.apply_chat_template(messages) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4.<|im_end|>\n"
        "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with_system = [{"role": "system", "content": "Be brief."}, *messages[:2]]
    assert embedded.apply_chat_template(with_system, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4.<|im_end|>\n"
    )
    ids = embedded.encode(embedded.apply_chat_template(messages[:1]))
    assert ids[0] == embedded.token_to_id("<|im_start|>") and ids.count(embedded.token_to_id("<|im_end|>")) == 2


def test_continue_final_message_ends_inside_the_last_message(embedded: Tokenizer) -> None:
    messages = [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi, I am"}]
    rendered = embedded.apply_chat_template(messages, add_generation_prompt=False, continue_final_message=True)
    assert rendered.endswith("<|im_start|>assistant\nHi, I am")
    with pytest.raises(ValueError, match="cannot both be set"):
        embedded.apply_chat_template(messages, continue_final_message=True)


def test_helpers_and_variables() -> None:
    template = (
        "{{ data | tojson }}|{{ data | tojson(indent=1) }}|{{ strftime_now('%Y') }}|{{ bos_token }}|{{ mode }}|"
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% if m.role == 'x' %}{% continue %}"
        "{% endif %}{{ m.role }}{{ 'C' if m.content is defined else 'N' }},{% endfor %}|"
        "{% generation %}G{% endgeneration %}|{% set ns = namespace(n=0) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}"
    )
    messages = [{"role": "user", "content": None}, {"role": "x"}, {"role": "z"}]
    rendered = render_chat_template(template, messages, special_tokens={"bos_token": "<s>", "eos_token": None},
                                    data={"q": "<é&>"}, mode="think")
    year = str(datetime.now().year)
    # tojson keeps non-ASCII and does not HTML-escape; content None is dropped (so "is defined" is false).
    assert rendered == f'{{"q": "<é&>"}}|{{\n "q": "<é&>"\n}}|{year}|<s>|think|userN,|G|1'


def test_trim_and_lstrip_blocks() -> None:
    template = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}"
    assert render_chat_template(template, [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "a\nb\n"


def test_raise_exception_becomes_value_error() -> None:
    template = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user turn') }}{% endif %}ok"
    assert render_chat_template(template, [{"role": "user", "content": ""}]) == "ok"
    with pytest.raises(ValueError, match="Conversations must start with a user turn"):
        render_chat_template(template, [{"role": "assistant", "content": ""}])


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ messages.__class__.__name__ }}",
    "{{ raise_exception.__globals__.keys() }}",
    "{% set _ = messages.append({'role': 'user'}) %}",
    "{% set _ = messages[0].update({'role': 'system'}) %}",
    "{% set ns = namespace(__class__=1) %}",
    "{% set ns = namespace() %}{% set ns._x = 1 %}",
    "{{ cycler.__init__.__globals__.os.system('true') }}",
])
def test_sandbox_refuses_unsafe_access(template: str) -> None:
    with pytest.raises(ValueError, match="chat template"):
        render_chat_template(template, [{"role": "user", "content": "x"}])


@pytest.mark.parametrize("template", ["{{ messages.__class__ }}", "{{ raise_exception.__globals__ }}"])
def test_sandbox_hides_internals_it_does_not_refuse(template: str) -> None:
    # A bare unsafe attribute is an undefined value that prints as nothing (as in transformers).
    assert render_chat_template(template, [{"role": "user", "content": "x"}]) == ""


def test_template_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="does not compile"):
        render_chat_template("{% for m in messages %}", [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="chat template failed"):
        render_chat_template("{{ messages[0].content + 1 }}", [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="at least one message"):
        render_chat_template("x", [])
    with pytest.raises(ValueError, match=r"messages\[0\] must be an object"):
        render_chat_template("x", ["hello"])  # type: ignore[list-item]


def test_compiled_templates_are_cached() -> None:
    assert compile_chat_template("{{ 1 }}") is compile_chat_template("{{ 1 }}")


def test_model_without_template_raises(embedded: Tokenizer) -> None:
    messages = [{"role": "user", "content": "x"}]
    assert embedded.apply_chat_template(messages, chat_template="{{ messages[0].content }}!") == "x!"
    saved = embedded.chat_template
    try:
        embedded.chat_template = None
        with pytest.raises(ValueError, match="no chat template"):
            embedded.apply_chat_template(messages)
    finally:
        embedded.chat_template = saved
