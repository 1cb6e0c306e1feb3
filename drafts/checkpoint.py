"""Resumable training checkpoints, written so that a kill -9 at any moment leaves a good one.

A checkpoint is one torch.save'd dict written to a temporary file in the same folder, fsync'd,
then renamed over the old one (rename is atomic on POSIX): a reader sees the old checkpoint or
the new one, never half of one. What it holds is everything the next step depends on: the step
number, the draft's trainable tensors, the optimizer state, the draft's description (so export
needs no target for a shared-embedding draft) and the loss history.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

import torch

from engine.model.arch_config import ArchConfig

CHECKPOINT_FILE = "checkpoint.pt"


@dataclass
class DraftMeta:
    """What a draft is, independent of its weights' values."""

    target: str  # the target's name (what `draftgate.target` records)
    arch: ArchConfig  # the draft's architecture (vocab_size: the target's vocabulary)
    shared_embedding: bool
    layer_ids: list[int]  # layers of the init source the draft started from
    vocab_ids: torch.Tensor | None  # [num_outputs] int64 sorted target ids, or None (full vocabulary)
    init_source: str = "target"  # "target" or the path of the checkpoint the layers came from
    kind: str = "layers"  # "layers": a small causal LM; "eagle": a head over the target's states (drafts/eagle.py)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "arch": asdict(self.arch), "shared_embedding": self.shared_embedding,
                "layer_ids": list(self.layer_ids), "init_source": self.init_source,
                "vocab_ids": None if self.vocab_ids is None else self.vocab_ids.cpu(), "kind": self.kind}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DraftMeta:
        arch = dict(data["arch"])
        for key in ("eos_token_ids", "layer_types"):
            if arch.get(key) is not None:
                arch[key] = tuple(arch[key])
        return cls(target=data["target"], arch=ArchConfig(**arch), shared_embedding=bool(data["shared_embedding"]),
                   layer_ids=list(data["layer_ids"]), vocab_ids=data["vocab_ids"],
                   init_source=data.get("init_source", "target"), kind=data.get("kind", "layers"))


def checkpoint_path(run_dir: str) -> str:
    return os.path.join(run_dir, CHECKPOINT_FILE)


def save_checkpoint(run_dir: str, payload: dict[str, Any]) -> None:
    os.makedirs(run_dir, exist_ok=True)
    path = checkpoint_path(run_dir)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    # The rename itself must reach the disk too, or a crash could bring back the old name.
    fd = os.open(run_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_checkpoint(run_dir: str) -> dict[str, Any] | None:
    """The checkpoint in run_dir, or None when there is none yet."""
    path = checkpoint_path(run_dir)
    if not os.path.isfile(path):
        return None
    return torch.load(path, map_location="cpu", weights_only=False)
