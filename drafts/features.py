"""The target's final hidden states over a corpus: what an EAGLE-style head drafts from.

An EAGLE head (drafts/eagle.py, engine/spec_decode/eagle.py) predicts the target's next hidden
state from the current one and the next token, so its training data is the target's own
final-norm hidden states at every corpus position. `FeatureCache` computes them once into a
memory-mapped `features_h{hidden}.npy` ([num_tokens, hidden] float16) next to the corpus,
resumable window by window like the teacher's top-k cache (a progress file records how many
windows are done, written only after their rows are flushed).

float16 rather than bfloat16: numpy has no bfloat16, and final-norm states are small numbers
(checked: a window whose states overflow float16 stops the precompute with an error).
"""

from __future__ import annotations

import os

import numpy as np
import torch
from tqdm import tqdm

from drafts.data.corpus import Corpus
from drafts.model import TrainableLlama
from drafts.teacher import WindowProgress, autocast_context, pad_windows

FLOAT16_MAX = 65504.0


class FeatureCache(WindowProgress):
    def __init__(self, folder: str, corpus: Corpus, hidden_size: int, target_name: str) -> None:
        super().__init__(folder, corpus, target_name, f"features_h{hidden_size}.json")
        self.hidden_size = hidden_size
        self._path = os.path.join(folder, f"features_h{hidden_size}.npy")
        self._features: np.ndarray | None = None  # [num_tokens, hidden] float16

    def _open(self, mode: str) -> np.ndarray:
        if mode == "w+":
            self._features = np.lib.format.open_memmap(self._path, mode="w+", dtype=np.float16,
                                                       shape=(self.corpus.num_tokens, self.hidden_size))
        else:
            self._features = np.load(self._path, mmap_mode=mode)
        return self._features

    @torch.no_grad()
    def precompute(self, target: TrainableLlama, *, batch_size: int, device: torch.device,
                   autocast_dtype: torch.dtype | None, progress: bool = True) -> None:
        """Fills the cache (resuming after the last recorded window). With a teacher top-k cache
        to fill too, TeacherCache.precompute(..., features=this) does both in one target pass."""
        done = self.windows_done
        if done >= self.corpus.num_windows:
            return
        self.begin()
        with tqdm(total=self.corpus.num_windows, initial=done, desc="target features", unit="window",
                  disable=not progress) as bar:
            for start in range(done, self.corpus.num_windows, batch_size):
                indices = list(range(start, min(start + batch_size, self.corpus.num_windows)))
                input_ids, lengths = pad_windows(self.corpus, indices, device)
                with autocast_context(device, autocast_dtype):
                    hidden = target(input_ids)  # [batch, seq, hidden]
                self.write(indices, lengths, hidden)
                bar.update(len(indices))
        self._open("r")

    def begin(self) -> None:
        """Opens the cache for writing the windows after windows_done."""
        os.makedirs(self.folder, exist_ok=True)
        self._open("r+" if self.windows_done > 0 and os.path.isfile(self._path) else "w+")

    def write(self, indices: list[int], lengths: list[int], hidden: torch.Tensor) -> None:
        """Stores the states of consecutive windows (hidden [batch, seq, hidden]) and records them
        as done (after the rows are flushed)."""
        assert self._features is not None, "begin() first"
        hidden = hidden.float()
        peak = float(hidden.abs().max())
        if not peak < FLOAT16_MAX:
            raise ValueError(f"target hidden states reach {peak:g} in windows {indices[0]}..{indices[-1]}: "
                             f"they do not fit float16")
        rows = hidden.cpu().numpy().astype(np.float16)
        for row, (index, length) in enumerate(zip(indices, lengths)):
            begin = int(self.corpus.window_starts[index])
            self._features[begin: begin + length] = rows[row, :length]
        self._features.flush()
        self._write_progress(indices[-1] + 1)

    def windows(self, window_indices: list[int], seq: int) -> torch.Tensor:
        """[batch, seq, hidden] float32 features of the windows, zero-padded on the right."""
        if not self.complete:
            raise ValueError(f"feature cache in {self.folder!r} is incomplete: run the precompute first")
        features = self._features if self._features is not None else self._open("r")
        out = np.zeros((len(window_indices), seq, self.hidden_size), dtype=np.float32)
        for row, index in enumerate(window_indices):
            begin = int(self.corpus.window_starts[index])
            end = min(int(self.corpus.window_starts[index + 1]), begin + seq)
            out[row, : end - begin] = features[begin:end]
        return torch.from_numpy(out)
