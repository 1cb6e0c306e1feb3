"""The distillation corpus: documents of token ids cut into training windows, plus held-out prompts.

`build_corpus` gathers (a) stdlib source files of the train split, up to a token budget, and
(b) target transcripts (chat, code tasks, code completions, tool loops), then writes:

- corpus.npz: tokens [num_tokens] int32 (all windows back to back), window_starts
  [num_windows + 1] int64, window_kinds [num_windows] int8 (index into KINDS);
- heldout.jsonl: evaluation prompts {"kind": "code"|"chat"|"tool", "prompt_token_ids": [...]},
  from held-out stdlib files, held-out topics and held-out tool scenarios;
- manifest.json: the data config and token counts per kind.

Every window starts a fresh context at position 0 (RoPE is relative, so a window's attention
pattern is the same as inside its document; only its earlier context is cut).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass

import numpy as np

from engine.model.tokenizer import TokenizerBase

from drafts.data import prompts as P
from drafts.data.stdlib import code_prompt, iter_sources, list_stdlib_files, split_files
from drafts.data.tool_sim import ToolSimulator
from drafts.data.transcripts import TranscriptGenerator, chat_prompt_ids, tool_eval_prompts

KINDS: tuple[str, ...] = ("stdlib", "chat", "code", "tool")
CORPUS_FILE = "corpus.npz"
HELDOUT_FILE = "heldout.jsonl"
MANIFEST_FILE = "manifest.json"
MIN_WINDOW_TOKENS = 16


@dataclass(frozen=True)
class DataConfig:
    """Sizes of each part (transcript counts are per kind); seq_len: training window length."""

    stdlib_tokens: int = 200_000
    num_chat: int = 200
    num_code_tasks: int = 100
    num_code_completions: int = 100
    num_tool: int = 200
    max_new_tokens: int = 256
    seq_len: int = 512
    held_out_percent: float = 10.0
    num_eval_prompts: int = 24  # per kind
    code_prompt_lines: int = 24
    seed: int = 0
    generation_batch_size: int = 32

    def __post_init__(self) -> None:
        for name in ("stdlib_tokens", "num_chat", "num_code_tasks", "num_code_completions", "num_tool",
                     "num_eval_prompts"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_new_tokens", "seq_len", "code_prompt_lines", "generation_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.seq_len < MIN_WINDOW_TOKENS:
            raise ValueError(f"seq_len must be >= {MIN_WINDOW_TOKENS}, got {self.seq_len}")


@dataclass
class Corpus:
    tokens: np.ndarray  # [num_tokens] int32
    window_starts: np.ndarray  # [num_windows + 1] int64
    window_kinds: np.ndarray  # [num_windows] int8

    @property
    def num_windows(self) -> int:
        return len(self.window_kinds)

    @property
    def num_tokens(self) -> int:
        return int(self.window_starts[-1])

    def window(self, index: int) -> np.ndarray:  # [window_len] int32
        return self.tokens[self.window_starts[index]: self.window_starts[index + 1]]

    def tokens_per_kind(self) -> dict[str, int]:
        lengths = np.diff(self.window_starts)
        return {kind: int(lengths[self.window_kinds == i].sum()) for i, kind in enumerate(KINDS)}

    def save(self, folder: str) -> None:
        path = os.path.join(folder, CORPUS_FILE)
        tmp = path + ".tmp.npz"
        np.savez(tmp, tokens=self.tokens, window_starts=self.window_starts, window_kinds=self.window_kinds)
        os.replace(tmp, path)

    @classmethod
    def load(cls, folder: str) -> Corpus:
        path = os.path.join(folder, CORPUS_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"data folder {folder!r} has no {CORPUS_FILE}: build it with `python -m drafts data`")
        with np.load(path) as data:
            return cls(data["tokens"], data["window_starts"], data["window_kinds"])

    @classmethod
    def from_documents(cls, documents: list[tuple[str, list[int]]], seq_len: int) -> Corpus:
        """documents: (kind, token ids); each is cut into windows of at most seq_len tokens
        (a last piece shorter than MIN_WINDOW_TOKENS is dropped)."""
        pieces: list[np.ndarray] = []
        starts = [0]
        kinds: list[int] = []
        for kind, ids in documents:
            for begin in range(0, len(ids), seq_len):
                piece = ids[begin: begin + seq_len]
                if len(piece) < MIN_WINDOW_TOKENS:
                    continue
                pieces.append(np.asarray(piece, dtype=np.int32))
                starts.append(starts[-1] + len(piece))
                kinds.append(KINDS.index(kind))
        tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
        return cls(tokens, np.asarray(starts, dtype=np.int64), np.asarray(kinds, dtype=np.int8))


def read_heldout(folder: str) -> list[tuple[str, list[int]]]:
    path = os.path.join(folder, HELDOUT_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data folder {folder!r} has no {HELDOUT_FILE}: build it with `python -m drafts data`")
    with open(path, encoding="utf-8") as f:
        return [(r["kind"], r["prompt_token_ids"]) for r in map(json.loads, f) if r]


def stdlib_documents(tokenizer: TokenizerBase, budget: int, held_out_percent: float,
                     seed: int) -> list[tuple[str, list[int]]]:
    train_files, _ = split_files(list_stdlib_files(), held_out_percent)
    documents: list[tuple[str, list[int]]] = []
    total = 0
    for _, text in iter_sources(train_files, seed):
        if total >= budget:
            break
        ids = tokenizer.encode(text, add_special_tokens=True)[: budget - total]
        documents.append(("stdlib", ids))
        total += len(ids)
    return documents


def heldout_prompts(tokenizer: TokenizerBase, config: DataConfig) -> list[tuple[str, list[int]]]:
    """num_eval_prompts per kind. code: half completions cut from held-out stdlib files, half
    held-out code tasks; chat: held-out topics; tool: held-out scenarios."""
    rng = random.Random(f"heldout:{config.seed}")
    _, held_files = split_files(list_stdlib_files(), config.held_out_percent)
    n = config.num_eval_prompts
    out: list[tuple[str, list[int]]] = []
    completions = []
    for _, text in iter_sources(held_files, config.seed):
        if len(completions) >= (n + 1) // 2:
            break
        snippet = code_prompt(text, num_lines=config.code_prompt_lines, rng=rng)
        if snippet:
            completions.append(tokenizer.encode(snippet, add_special_tokens=True))
    tasks = P.sample_items(P.code_task_prompts(held_out=True, held_out_percent=config.held_out_percent),
                           n - len(completions), rng)
    out += [("code", ids) for ids in completions] + [("code", chat_prompt_ids(tokenizer, t)) for t in tasks]
    chats = P.sample_items(P.chat_prompts(held_out=True, held_out_percent=config.held_out_percent), n, rng)
    out += [("chat", chat_prompt_ids(tokenizer, item)) for item in chats]
    sim = ToolSimulator(held_files, seed=config.seed + 1)
    tool_items = P.sample_items(_tool_items(sim, held_out=True, config=config), n, rng)
    out += [("tool", ids) for ids in tool_eval_prompts(tokenizer, tool_items, sim, rng)]
    return out


def _tool_items(sim: ToolSimulator, *, held_out: bool, config: DataConfig) -> list[P.PromptItem]:
    rng = random.Random(f"toolpaths:{config.seed}:{held_out}")
    files = sim.file_paths
    dirs = sim.dir_paths
    return P.tool_prompts(held_out=held_out, held_out_percent=config.held_out_percent,
                          file_paths=rng.sample(files, min(12, len(files))), dir_paths=rng.sample(dirs, min(6, len(dirs))))


def build_corpus(folder: str, config: DataConfig, tokenizer: TokenizerBase,
                 generator: TranscriptGenerator | None = None) -> Corpus:
    """Builds (or completes) the data folder. generator None: only stdlib text, which is
    allowed only when every transcript count is 0."""
    os.makedirs(folder, exist_ok=True)
    wanted = config.num_chat + config.num_code_tasks + config.num_code_completions + config.num_tool
    if generator is None and wanted:
        raise ValueError("transcripts (num_chat, num_code_tasks, num_code_completions, num_tool) need the target "
                         "to generate them: pass a generator, or set those counts to 0")
    documents = stdlib_documents(tokenizer, config.stdlib_tokens, config.held_out_percent, config.seed)
    rng = random.Random(f"train:{config.seed}")
    train_files, _ = split_files(list_stdlib_files(), config.held_out_percent)
    sim = ToolSimulator(train_files, seed=config.seed)
    parts: list[tuple[str, list[P.PromptItem]]] = [
        ("chat", P.sample_items(P.chat_prompts(held_out=False, held_out_percent=config.held_out_percent),
                                config.num_chat, rng)),
        ("code_tasks", P.sample_items(P.code_task_prompts(held_out=False, held_out_percent=config.held_out_percent),
                                      config.num_code_tasks, rng)),
        ("code_completions", _completion_items(train_files, config, rng)),
        ("tool", P.sample_items(_tool_items(sim, held_out=False, config=config), config.num_tool, rng)),
    ]
    transcripts_dir = os.path.join(folder, "transcripts")
    for name, items in parts:
        if not items or generator is None:
            continue
        path = os.path.join(transcripts_dir, f"train_{name}.jsonl")
        for transcript in generator.fill(path, items, tools=sim, desc=name):
            documents.append((transcript.kind, transcript.token_ids))
    corpus = Corpus.from_documents(documents, config.seq_len)
    corpus.save(folder)
    with open(os.path.join(folder, HELDOUT_FILE), "w", encoding="utf-8") as f:
        for kind, ids in heldout_prompts(tokenizer, config):
            f.write(json.dumps({"kind": kind, "prompt_token_ids": ids}) + "\n")
    with open(os.path.join(folder, MANIFEST_FILE), "w", encoding="utf-8") as f:
        json.dump({"config": asdict(config), "num_windows": corpus.num_windows, "num_tokens": corpus.num_tokens,
                   "tokens_per_kind": corpus.tokens_per_kind()}, f, indent=2)
    return corpus


def _completion_items(train_files: list, config: DataConfig, rng: random.Random) -> list[P.PromptItem]:
    items: list[P.PromptItem] = []
    for file, text in iter_sources(train_files, config.seed + 7):
        if len(items) >= config.num_code_completions:
            break
        snippet = code_prompt(text, num_lines=config.code_prompt_lines, rng=rng)
        if snippet:
            items.append(P.PromptItem("completion", file.relative_path, snippet))
    return items
