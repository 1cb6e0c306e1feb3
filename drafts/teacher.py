"""Teacher targets: the target's top-k next-token log-probs for each training window.

Two sources behind one call, `targets(window_indices, input_ids)`:
- `OnTheFlyTeacher` runs the target in every step (any k, including the full vocabulary);
- `TeacherCache` precomputes top-k once for the whole corpus into memory-mapped .npy files
  (ids int32, log-probs float16) and reads them back. On a CPU the target's forward is most of a
  step's cost, so precomputing once and training several epochs is the cheaper plan. The
  precompute is resumable: a progress file records how many windows are done, written only
  after their rows are flushed.
"""

from __future__ import annotations

import json
import os
from contextlib import nullcontext
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch
from tqdm import tqdm

from drafts.data.corpus import Corpus
from drafts.loss import teacher_topk
from drafts.model import TrainableLlama

if TYPE_CHECKING:
    from drafts.features import FeatureCache


class TeacherSource(Protocol):
    top_k: int

    def targets(self, window_indices: list[int], input_ids: torch.Tensor,  # [batch, seq] int64
                ) -> tuple[torch.Tensor, torch.Tensor]:  # ([batch, seq, k] int64, [batch, seq, k] float32)
        ...


def autocast_context(device: torch.device, dtype: torch.dtype | None):  # -> context manager
    """bf16/fp16 autocast on `device`, or nothing when dtype is None."""
    if dtype is None:
        return nullcontext()
    return torch.autocast(device.type, dtype=dtype)


class OnTheFlyTeacher:
    """Runs the wrapped target under no_grad; logits are made `chunk_tokens` rows at a time so
    [tokens, vocab] float32 never has to exist for a whole batch at once (151k-token vocabularies)."""

    def __init__(self, model: TrainableLlama, top_k: int, *, autocast_dtype: torch.dtype | None,
                 chunk_tokens: int = 2048) -> None:
        self.model = model
        self.top_k = top_k
        self.autocast_dtype = autocast_dtype
        self.chunk_tokens = chunk_tokens

    @torch.no_grad()
    def targets(self, window_indices: list[int], input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids, logprobs, _ = self.targets_and_states(input_ids)
        return ids, logprobs

    @torch.no_grad()
    def targets_and_states(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(top-k ids, their log-probs, the final-norm states [batch, seq, hidden] they come from)."""
        device = input_ids.device
        with autocast_context(device, self.autocast_dtype):
            hidden = self.model(input_ids)  # [batch, seq, hidden]
        flat = hidden.reshape(-1, hidden.shape[-1])
        ids, logprobs = [], []
        for start in range(0, flat.shape[0], self.chunk_tokens):
            with autocast_context(device, self.autocast_dtype):
                logits = self.model.logits(flat[start: start + self.chunk_tokens])
            chunk_ids, chunk_lp = teacher_topk(logits, self.top_k)
            ids.append(chunk_ids)
            logprobs.append(chunk_lp)
        shape = (*input_ids.shape, -1)
        return torch.cat(ids).view(shape), torch.cat(logprobs).view(shape), hidden


class WindowProgress:
    """The progress file of a per-window precompute over a corpus: how many windows (in corpus
    order) are written, for which target and corpus. Written only after the rows are flushed."""

    def __init__(self, folder: str, corpus: Corpus, target_name: str, progress_file: str) -> None:
        self.folder = folder
        self.corpus = corpus
        self.target_name = target_name
        self._progress_path = os.path.join(folder, progress_file)

    @property
    def windows_done(self) -> int:
        if not os.path.isfile(self._progress_path):
            return 0
        with open(self._progress_path, encoding="utf-8") as f:
            progress = json.load(f)
        if progress.get("target") != self.target_name or progress.get("num_tokens") != self.corpus.num_tokens:
            return 0  # another target or another corpus: start over
        return int(progress["windows_done"])

    @property
    def complete(self) -> bool:
        return self.windows_done >= self.corpus.num_windows

    def _write_progress(self, windows_done: int) -> None:
        tmp = self._progress_path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"target": self.target_name, "num_tokens": self.corpus.num_tokens,
                       "windows_done": windows_done}, f)
        os.replace(tmp, self._progress_path)


class TeacherCache(WindowProgress):
    """Precomputed top-k over a corpus, in `folder`: teacher_k{k}_ids.npy [num_tokens, k] int32,
    teacher_k{k}_logprobs.npy [num_tokens, k] float16, teacher_k{k}.json progress."""

    def __init__(self, folder: str, corpus: Corpus, top_k: int, target_name: str) -> None:
        super().__init__(folder, corpus, target_name, f"teacher_k{top_k}.json")
        self.top_k = top_k
        self._ids_path = os.path.join(folder, f"teacher_k{top_k}_ids.npy")
        self._lp_path = os.path.join(folder, f"teacher_k{top_k}_logprobs.npy")
        self._ids: np.ndarray | None = None
        self._logprobs: np.ndarray | None = None

    def _open(self, mode: str) -> None:
        shape = (self.corpus.num_tokens, self.top_k)
        if mode == "w+":
            self._ids = np.lib.format.open_memmap(self._ids_path, mode="w+", dtype=np.int32, shape=shape)
            self._logprobs = np.lib.format.open_memmap(self._lp_path, mode="w+", dtype=np.float16, shape=shape)
        else:
            self._ids = np.load(self._ids_path, mmap_mode=mode)
            self._logprobs = np.load(self._lp_path, mmap_mode=mode)

    def precompute(self, teacher: OnTheFlyTeacher, *, batch_size: int, device: torch.device,
                   features: FeatureCache | None = None) -> None:
        """Fills the cache (resuming after the last recorded window). features: a target-state
        cache (EAGLE training) that, when it stands where this one does, is filled in the same
        pass: both come from one forward of the target, which is most of either's cost."""
        if teacher.top_k != self.top_k:
            raise ValueError(f"teacher top_k {teacher.top_k} != cache top_k {self.top_k}")
        done = self.windows_done
        if done >= self.corpus.num_windows:
            return
        if features is not None and (features.complete or features.windows_done != done):
            features = None  # apart (one was resumed alone): each fills its own windows
        if features is not None:
            features.begin()
        self._open("r+" if done > 0 and os.path.isfile(self._ids_path) else "w+")
        assert self._ids is not None and self._logprobs is not None
        # Windows in corpus order: progress means "every window below windows_done is written".
        with tqdm(total=self.corpus.num_windows, initial=done, desc="teacher top-k", unit="window") as bar:
            for start in range(done, self.corpus.num_windows, batch_size):
                indices = list(range(start, min(start + batch_size, self.corpus.num_windows)))
                input_ids, lengths = pad_windows(self.corpus, indices, device)
                ids, logprobs, hidden = teacher.targets_and_states(input_ids)
                if features is not None:
                    features.write(indices, lengths, hidden)
                for row, (index, length) in enumerate(zip(indices, lengths)):
                    begin = int(self.corpus.window_starts[index])
                    self._ids[begin: begin + length] = ids[row, :length].cpu().numpy().astype(np.int32)
                    self._logprobs[begin: begin + length] = logprobs[row, :length].cpu().numpy().astype(np.float16)
                self._ids.flush()
                self._logprobs.flush()
                self._write_progress(indices[-1] + 1)
                bar.update(len(indices))
        self._open("r")

    def targets(self, window_indices: list[int], input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.complete:
            raise ValueError(f"teacher cache in {self.folder!r} is incomplete: run the precompute first")
        if self._ids is None:
            self._open("r")
        assert self._ids is not None and self._logprobs is not None
        batch, seq = input_ids.shape
        ids = np.zeros((batch, seq, self.top_k), dtype=np.int64)
        # Padding positions get log-prob 0 for id 0: harmless, the loss mask drops them.
        logprobs = np.zeros((batch, seq, self.top_k), dtype=np.float32)
        for row, index in enumerate(window_indices):
            begin = int(self.corpus.window_starts[index])
            end = min(int(self.corpus.window_starts[index + 1]), begin + seq)
            ids[row, : end - begin] = self._ids[begin:end]
            logprobs[row, : end - begin] = self._logprobs[begin:end]
        device = input_ids.device
        return torch.from_numpy(ids).to(device), torch.from_numpy(logprobs).to(device)


def pad_windows(corpus: Corpus, indices: list[int], device: torch.device,
                ) -> tuple[torch.Tensor, list[int]]:  # ([batch, max_len] int64 right-padded with 0, lengths)
    windows = [corpus.window(i) for i in indices]
    lengths = [len(w) for w in windows]
    batch = np.zeros((len(windows), max(lengths)), dtype=np.int64)
    for row, window in enumerate(windows):
        batch[row, : len(window)] = window
    return torch.from_numpy(batch).to(device), lengths
