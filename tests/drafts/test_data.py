"""Distillation data: stdlib split, prompts, simulated tools, transcripts, corpus, draft vocabulary."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from drafts.data import prompts as P
from drafts.data.corpus import Corpus, DataConfig, build_corpus, read_heldout
from drafts.data.stdlib import is_held_out, list_stdlib_files, split_files, stdlib_root
from drafts.data.tool_sim import ToolSimulator, parse_tool_call
from drafts.data.transcripts import TranscriptGenerator, read_cache, render
from drafts.vocab import count_tokens, select_draft_vocab, target_to_draft_map


def test_stdlib_split_is_by_file_and_stable() -> None:
    files = list_stdlib_files()
    assert len(files) > 300
    paths = [f.relative_path for f in files]
    assert "json/decoder.py" in paths and not any("site-packages" in p for p in paths)
    train, held = split_files(files, 10.0)
    assert {f.relative_path for f in train}.isdisjoint(f.relative_path for f in held)
    assert len(train) + len(held) == len(files)
    assert 0.05 < len(held) / len(files) < 0.15
    # Decided by the path alone: the same on every machine, whatever else is installed.
    assert [is_held_out(p, 10.0) for p in paths] == [is_held_out(p, 10.0) for p in paths]
    assert is_held_out("json/decoder.py", 10.0) == ("json/decoder.py" in {f.relative_path for f in held})
    assert os.path.isdir(stdlib_root())


def test_prompt_splits_share_no_topic() -> None:
    train = P.chat_prompts(held_out=False, held_out_percent=20)
    held = P.chat_prompts(held_out=True, held_out_percent=20)
    assert train and held
    assert {p.key for p in train}.isdisjoint(p.key for p in held)
    code_train = P.code_task_prompts(held_out=False, held_out_percent=20)
    code_held = P.code_task_prompts(held_out=True, held_out_percent=20)
    assert {p.key for p in code_train}.isdisjoint(p.key for p in code_held)
    tools = P.tool_prompts(held_out=True, held_out_percent=20, file_paths=["a.py"], dir_paths=["email"])
    assert any(item.tool == "read_file" and item.argument == "a.py" for item in tools)
    offered = P.tool_subset(random.Random(0), "grep")
    assert "grep" in [t["function"]["name"] for t in offered] and 2 <= len(offered) <= 4


def test_simulated_tools() -> None:
    files = list_stdlib_files()
    sim = ToolSimulator(files, seed=0)
    text = sim.run("read_file", {"path": "json/decoder.py"})
    assert "JSONDecodeError" in text  # the real file's content
    assert "decoder.py" in sim.run("list_directory", {"path": "json"})
    assert "error" in sim.run("read_file", {"path": "no/such.py"})
    assert json.loads(sim.run("calculator", {"expression": "(12 + 8) * 3"}))["result"] == 60
    assert json.loads(sim.run("calculator", {"expression": "2 ** 10"}))["result"] == 1024
    assert "error" in json.loads(sim.run("calculator", {"expression": "9 ** 9 ** 9"}))["result"]
    assert sim.run("run_python", {"code": "print(2 ** 16)"}).strip() == "65536"
    assert "error" in sim.run("run_python", {"code": "import os; os.system('ls')"})
    assert "unknown tool" in sim.run("launch_rocket", {})
    assert "error" in sim.run("get_weather", "Paris")
    assert parse_tool_call('ok <tool_call>\n{"name": "grep", "arguments": {"pattern": "x"}}\n</tool_call>') == \
        ("grep", {"pattern": "x"})
    assert parse_tool_call("<tool_call>{not json}</tool_call>") is None
    assert parse_tool_call("no call") is None


def test_corpus_windows_round_trip(tmp_path: Path) -> None:
    documents = [("stdlib", list(range(100))), ("chat", list(range(10))), ("tool", list(range(40)))]
    corpus = Corpus.from_documents(documents, seq_len=32)
    # 100 -> 32, 32, 32, (4 dropped); 10 dropped (< 16 tokens); 40 -> 32, (8 dropped)
    assert np.diff(corpus.window_starts).tolist() == [32, 32, 32, 32]
    assert corpus.tokens_per_kind() == {"stdlib": 96, "chat": 0, "code": 0, "tool": 32}
    assert corpus.window(1).tolist() == list(range(32, 64))
    corpus.save(str(tmp_path))
    loaded = Corpus.load(str(tmp_path))
    assert np.array_equal(loaded.tokens, corpus.tokens) and np.array_equal(loaded.window_kinds, corpus.window_kinds)
    with pytest.raises(FileNotFoundError, match="corpus.npz"):
        Corpus.load(str(tmp_path / "missing"))


def test_draft_vocabulary() -> None:
    counts = np.array([5, 0, 9, 9, 1, 7, 0, 3])
    vocab = select_draft_vocab(counts, 4, always=[6])
    assert vocab.tolist() == [2, 3, 5, 6]  # special 6 first, then 9, 9 (lower id first), 7
    assert select_draft_vocab(counts, 8, always=[]).tolist() == list(range(8))
    with pytest.raises(ValueError, match="draft_vocab_size"):
        select_draft_vocab(counts, 9, always=[])
    with pytest.raises(ValueError, match="special"):
        select_draft_vocab(counts, 1, always=[0, 1])
    assert count_tokens(np.array([1, 1, 3], dtype=np.int32), 5).tolist() == [0, 2, 0, 1, 0]
    assert target_to_draft_map(torch.tensor([1, 4]), 6).tolist() == [-1, 0, -1, -1, 1, -1]


def test_tool_prompts_render_like_the_gateway(tiny_target) -> None:
    from gateway.chat_prompt import render_chat_prompt
    from gateway.tool_prompt import ToolChoice

    tokenizer = tiny_target.tokenizer
    tools = P.tool_subset(random.Random(1), "get_weather")
    messages = [{"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
                {"role": "tool", "tool_call_id": "c", "content": '{"temperature": 3}'}]
    ours = tokenizer.encode(render(tokenizer, messages, tools, add_generation_prompt=True))
    assert ours == render_chat_prompt(tokenizer, messages, tools, ToolChoice("auto")).token_ids


def test_transcripts_are_generated_cached_and_extended(tiny_target_dir: str, tmp_path: Path) -> None:
    from engine.llm import LLM

    llm = LLM(tiny_target_dir, dtype="float32", kv_cache_memory="16MiB", num_threads=1)
    generator = TranscriptGenerator(llm, max_new_tokens=6, seed=0, batch_size=2)
    items = P.chat_prompts(held_out=False, held_out_percent=10)[:3]
    path = str(tmp_path / "chat.jsonl")
    first = generator.fill(path, items[:2])
    assert len(first) == 2 and len(read_cache(path)) == 2
    prompt = llm.tokenizer.encode(llm.tokenizer.apply_chat_template([{"role": "user", "content": items[0].text}]))
    assert first[0].token_ids[: len(prompt)] == prompt
    assert len(prompt) < len(first[0].token_ids) <= len(prompt) + 6
    # A cut last line (a kill mid-write) is dropped; a larger request generates only the rest.
    with open(path, "a") as f:
        f.write('{"kind": "chat", "token_')
    more = generator.fill(path, items)
    assert [t.token_ids for t in more[:2]] == [t.token_ids for t in first]
    assert len(read_cache(path)) == 3

    sim = ToolSimulator(list_stdlib_files()[:50], seed=0)
    tool_items = P.tool_prompts(held_out=False, held_out_percent=10, file_paths=sim.file_paths[:2],
                                dir_paths=sim.dir_paths[:1])[:2]
    tools = generator.fill(str(tmp_path / "tool.jsonl"), tool_items, tools=sim)
    assert len(tools) == 2 and all(t.kind == "tool" for t in tools)
    text = llm.tokenizer.decode(tools[0].token_ids, skip_special_tokens=False)
    assert "<tools>" in text and tool_items[0].text in text


def test_build_corpus_stdlib_only(tiny_target, tmp_path: Path) -> None:
    config = DataConfig(stdlib_tokens=3000, num_chat=0, num_code_tasks=0, num_code_completions=0, num_tool=0,
                        seq_len=256, num_eval_prompts=2)
    corpus = build_corpus(str(tmp_path), config, tiny_target.tokenizer)
    assert corpus.num_tokens <= 3000 and corpus.num_tokens > 2000
    assert corpus.tokens_per_kind()["stdlib"] == corpus.num_tokens
    heldout = read_heldout(str(tmp_path))
    assert [kind for kind, _ in heldout] == ["code"] * 2 + ["chat"] * 2 + ["tool"] * 2
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["num_tokens"] == corpus.num_tokens
    with pytest.raises(ValueError, match="num_chat"):
        build_corpus(str(tmp_path), DataConfig(num_chat=1), tiny_target.tokenizer)
