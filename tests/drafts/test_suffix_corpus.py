"""`python -m drafts suffix-corpus`: the assistant turns of a data folder's chat transcripts, raw
completions whole, each a document of the corpus the engine reads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from drafts.cli import main
from drafts.suffix_corpus import assistant_header, assistant_turns, build_suffix_corpus
from engine.model.resolve import resolve_model
from engine.model.tokenizer import load_tokenizer
from engine.spec_decode.corpus import SEPARATOR, SuffixCorpus


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model(None))


def test_assistant_turns_are_cut_at_each_end_of_turn() -> None:
    header, end = [1, 2], frozenset({9})
    assert assistant_turns([5, 1, 2, 7, 8, 9, 4, 1, 2, 6, 9, 1, 2, 3], header, end) == [[7, 8, 9], [6, 9], [3]]
    assert assistant_turns([5, 6, 7], header, end) == []


def _write(folder, name: str, token_lists: list[list[int]]) -> None:
    transcripts = folder / "transcripts"
    transcripts.mkdir(exist_ok=True)
    with open(transcripts / name, "w", encoding="utf-8") as f:
        for ids in token_lists:
            f.write(json.dumps({"kind": "x", "token_ids": ids}) + "\n")


def test_a_data_folder_becomes_a_corpus_of_the_targets_own_text(tokenizer, tmp_path) -> None:
    answer = "def add(a, b):\n    return a + b"
    chat = tokenizer.encode(tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write add."}, {"role": "assistant", "content": answer}],
        add_generation_prompt=False))
    completion = tokenizer.encode("import os\nprint(os.getcwd())")
    _write(tmp_path, "train_chat.jsonl", [chat])
    _write(tmp_path, "train_code_completions.jsonl", [completion])
    tokens, counts = build_suffix_corpus(str(tmp_path), tokenizer)
    assert counts == {"train_chat.jsonl": 1, "train_code_completions.jsonl": 1}
    documents = np.split(tokens, np.flatnonzero(tokens == SEPARATOR) + 1)[:-1]
    turn = documents[0][:-1].tolist()  # the chat's only assistant turn, up to its end of turn
    assert tokenizer.decode(turn, skip_special_tokens=True).strip() == answer
    assert turn[-1] in tokenizer.eos_token_ids
    header = assistant_header(tokenizer)
    starts = [i + len(header) for i in range(len(chat)) if chat[i: i + len(header)] == header]
    assert header and [chat[i: i + len(turn)] for i in starts] == [turn]  # the turn starts right after it
    assert documents[1][:-1].tolist() == completion  # no chat template: kept whole
    out = tmp_path / "corpus.npy"
    assert main(["suffix-corpus", "--data", str(tmp_path), "--out", str(out)]) == 0
    corpus = SuffixCorpus.load(str(out))
    assert corpus.num_tokens == len(turn) + len(completion)
    assert corpus.occurs(tuple(turn[:4]))


def test_a_folder_without_transcripts_is_refused(tokenizer, tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="drafts data"):
        build_suffix_corpus(str(tmp_path), tokenizer)
