"""The embedded GGUF model through our loader, tokenizer and engine, against transformers' own GGUF
loader and generate() on the same file: an independent reference for the whole path."""

from __future__ import annotations

import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.model.resolve import embedded_gguf_path

PROMPTS = [
    "The capital of France is",
    "import numpy as np\n\ndef softmax(x):\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    folder, name = os.path.split(embedded_gguf_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return tokenizer, model.eval()


def test_tokens_and_greedy_continuations_match_transformers(hf) -> None:
    tokenizer, model = hf
    llm = LLM(kv_cache_memory="128MiB", dtype="float32")
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        assert out.prompt_token_ids == ids[0].tolist()
        with torch.inference_mode():
            expected = model.generate(ids, max_new_tokens=16, do_sample=False)[0, ids.shape[1]:].tolist()
        # Both stop at an end-of-turn token or after 16 tokens; up to that point they must agree.
        common = min(len(out.token_ids), len(expected))
        assert common > 0 and out.token_ids[:common] == expected[:common], (prompt, out.token_ids, expected)
        for ours_or_theirs in (out.token_ids, expected):
            assert len(ours_or_theirs) == 16 or ours_or_theirs[-1] in llm.tokenizer.eos_token_ids
