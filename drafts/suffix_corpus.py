"""The suffix corpus of a target: its own answers in a data folder's transcripts, as the engine's
suffix drafting reads them (engine/spec_decode/corpus.py).

    python -m drafts suffix-corpus --data runs/d/data --out drafts/smollm2-135m-suffix-corpus.npy

Of a chat transcript only the assistant turns are kept (what the target wrote; the prompts' text
is the users' and the tool results the simulator's), each a document of its own ended by the
template's end of turn. The assistant turn's header is found by rendering a conversation with the
tokenizer's chat template with and without the generation prompt. A transcript without that
header is a raw completion (drafts/data's code completions: a standard-library file's opening
lines and the target's continuation of them) and is kept whole.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np

from engine.model.tokenizer import TokenizerBase
from engine.spec_decode.corpus import SEPARATOR


def assistant_header(tokenizer: TokenizerBase) -> list[int]:
    """The tokens the chat template puts before an assistant turn's text."""
    messages = [{"role": "user", "content": "x"}]
    without = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=False))
    with_prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
    if with_prompt[: len(without)] != without or len(with_prompt) == len(without):
        raise ValueError("the chat template's generation prompt is not a suffix of the rendered conversation")
    return with_prompt[len(without):]


def assistant_turns(token_ids: list[int], header: list[int], end_ids: frozenset[int]) -> list[list[int]]:
    """Every span after `header` up to and including the first end-of-turn token (or the end)."""
    turns = []
    n = len(header)
    i = 0
    while i + n <= len(token_ids):
        if token_ids[i: i + n] != header:
            i += 1
            continue
        start = end = i + n
        while end < len(token_ids) and token_ids[end] not in end_ids:
            end += 1
        turn = token_ids[start: min(end + 1, len(token_ids))]
        if turn:
            turns.append(turn)
        i = end + 1
    return turns


def build_suffix_corpus(data_dir: str, tokenizer: TokenizerBase) -> tuple[np.ndarray, dict[str, int]]:
    """([num_tokens] int32 token ids with a SEPARATOR after each turn, turns per transcript file)."""
    header = assistant_header(tokenizer)
    end_ids = frozenset(tokenizer.eos_token_ids)
    paths = sorted(glob.glob(os.path.join(data_dir, "transcripts", "train_*.jsonl")))
    if not paths:
        raise FileNotFoundError(f"{data_dir}/transcripts has no train_*.jsonl: build it with `python -m drafts data`")
    parts: list[list[int]] = []
    counts: dict[str, int] = {}
    for path in paths:
        name = os.path.basename(path)
        counts[name] = 0
        with open(path, encoding="utf-8") as f:
            for line in f:
                token_ids = json.loads(line)["token_ids"]
                for turn in assistant_turns(token_ids, header, end_ids) or [token_ids]:
                    parts.append(turn + [SEPARATOR])
                    counts[name] += 1
    tokens = np.asarray([t for part in parts for t in part], dtype=np.int32)
    return tokens, counts


def write_suffix_corpus(data_dir: str, out_path: str, tokenizer: TokenizerBase) -> dict[str, int]:
    tokens, counts = build_suffix_corpus(data_dir, tokenizer)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = out_path + ".tmp.npy"
    np.save(tmp, tokens)
    os.replace(tmp, out_path)
    return {**counts, "tokens": int(np.count_nonzero(tokens != SEPARATOR))}
