"""The distillation loop: AdamW, warmup + cosine schedule, autocast, resumable checkpoints.

Determinism is what makes resume exact: the windows of step s are a pure function of (seed, s)
(a seeded permutation per epoch), the learning rate is a pure function of s, and everything
else the next step reads (weights, AdamW moments, step count) is in the checkpoint. A run
killed at any moment and restarted replays the steps after its last checkpoint on the same
batches and continues the same loss trajectory.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from drafts.checkpoint import DraftMeta, load_checkpoint, save_checkpoint
from drafts.data.corpus import Corpus
from drafts.loss import topk_kl
from drafts.model import TrainableLlama
from drafts.teacher import TeacherSource, autocast_context, pad_windows
from kernels.onednn_linear import onednn_bf16_available

LOG_FILE = "log.jsonl"


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 2000
    batch_size: int = 8  # windows per step
    lr: float = 3e-4
    min_lr_ratio: float = 0.1  # the cosine ends at lr * min_lr_ratio
    warmup_steps: int = 50
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 100
    log_every: int = 10
    # Positions per output-head chunk: the [positions, vocab] logits of one chunk at a time
    # exist (a 151k vocabulary at 16 x 2048 positions would need tens of GB at once).
    loss_chunk_tokens: int = 4096

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "checkpoint_every", "log_every", "loss_chunk_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.warmup_steps < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("warmup_steps, weight_decay and grad_clip must be >= 0")


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warmup to lr, then cosine down to lr * min_lr_ratio at the last step."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(config.steps - config.warmup_steps, 1)
    progress = min((step - config.warmup_steps) / span, 1.0)
    floor = config.lr * config.min_lr_ratio
    return floor + (config.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def resolve_autocast(setting: str, device: torch.device) -> torch.dtype | None:
    """"auto": bf16 on CUDA, and on CPUs with bf16 matmuls in hardware (AMX tiles or AVX512-BF16:
    on an AVX512-BF16 EPYC the EAGLE head's loss matmul, [4096, 576] x [576, 8192] forward and
    backward, took 0.51 s against 1.46 s in float32); else none."""
    if setting == "none":
        return None
    if setting in ("bf16", "bfloat16"):
        return torch.bfloat16
    if setting in ("fp16", "float16"):
        return torch.float16
    if setting != "auto":
        raise ValueError(f"autocast must be 'auto', 'bf16', 'fp16' or 'none', got {setting!r}")
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if onednn_bf16_available() else None


class Distiller:
    """Trains `draft` to match `teacher` on `corpus`; checkpoints and logs go to run_dir."""

    def __init__(self, draft: TrainableLlama, teacher: TeacherSource, corpus: Corpus, config: TrainConfig,
                 run_dir: str, meta: DraftMeta, *, target_to_draft: torch.Tensor | None,
                 autocast_dtype: torch.dtype | None, progress: bool = True) -> None:
        if corpus.num_windows == 0:
            raise ValueError("the corpus has no windows to train on")
        self.draft = draft
        self.teacher = teacher
        self.corpus = corpus
        self.config = config
        self.run_dir = run_dir
        self.meta = meta
        self.target_to_draft = target_to_draft
        self.autocast_dtype = autocast_dtype
        self.progress = progress
        self.device = draft.norm.weight.device
        self._params = [p for _, p in draft.named_parameters() if p.requires_grad]
        # Decay only matrices (not norm weights), the usual choice.
        decay = [p for p in self._params if p.dim() >= 2]
        no_decay = [p for p in self._params if p.dim() < 2]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                            {"params": no_decay, "weight_decay": 0.0}], lr=config.lr)
        self.step = 0
        self.losses: list[float] = []
        self._resume()

    # ---- data order: a pure function of (seed, step) --------------------------------------------
    def batch_indices(self, step: int) -> list[int]:
        num_windows = self.corpus.num_windows
        first = step * self.config.batch_size
        indices: list[int] = []
        for position in range(first, first + self.config.batch_size):
            epoch, offset = divmod(position, num_windows)
            indices.append(int(self._permutation(epoch)[offset]))
        return indices

    def _permutation(self, epoch: int) -> np.ndarray:
        cached = getattr(self, "_perm_cache", None)
        if cached is None or cached[0] != epoch:
            perm = np.random.default_rng([self.config.seed, epoch]).permutation(self.corpus.num_windows)
            self._perm_cache = (epoch, perm)
        return self._perm_cache[1]

    # ---- checkpoints --------------------------------------------------------------------------
    def _resume(self) -> None:
        payload = load_checkpoint(self.run_dir)
        if payload is None:
            return
        saved = payload["meta"]
        if saved["arch"] != asdict(self.meta.arch) or saved["shared_embedding"] != self.meta.shared_embedding:
            raise ValueError(f"run folder {self.run_dir!r} holds a checkpoint of another draft architecture: "
                             "use a new --run folder")
        state = payload["model"]
        missing = [name for name in self.draft.trainable_state() if name not in state]
        if missing:
            raise ValueError(f"checkpoint in {self.run_dir!r} lacks {missing[0]!r}")
        with torch.no_grad():
            for name, param in self.draft.named_parameters():
                if param.requires_grad:
                    param.copy_(state[name])
        self.optimizer.load_state_dict(payload["optimizer"])
        self.step = int(payload["step"])
        self.losses = list(payload["losses"])

    def save(self) -> None:
        save_checkpoint(self.run_dir, {
            "step": self.step,
            "model": {name: t.cpu() for name, t in self.draft.trainable_state().items()},
            "optimizer": self.optimizer.state_dict(),
            "meta": self.meta.to_dict(),
            "train_config": asdict(self.config),
            "losses": self.losses,
        })

    # ---- the loop -------------------------------------------------------------------------------
    def _begin_step(self) -> float:
        """Sets this step's learning rate (returned) and clears the gradients."""
        lr = lr_at(self.step, self.config)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.draft.train()
        self.optimizer.zero_grad(set_to_none=True)
        return lr

    def _finish_step(self, loss_value: float) -> float:
        """Clips the gradients, steps the optimizer, records the loss; returns the gradient norm."""
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self._params, self.config.grad_clip)) \
            if self.config.grad_clip > 0 else 0.0
        self.optimizer.step()
        self.losses.append(loss_value)
        self.step += 1
        return grad_norm

    def train_step(self) -> dict[str, float]:
        indices = self.batch_indices(self.step)
        input_ids, lengths = pad_windows(self.corpus, indices, self.device)
        teacher_ids, teacher_logprobs = self.teacher.targets(indices, input_ids)
        mask = torch.arange(input_ids.shape[1], device=self.device)[None, :] < torch.tensor(lengths, device=self.device)[:, None]
        lr = self._begin_step()
        with autocast_context(self.device, self.autocast_dtype):
            hidden = self.draft(input_ids)[mask]  # [num_positions, hidden]: padding dropped
        teacher_ids, teacher_logprobs = teacher_ids[mask], teacher_logprobs[mask]  # [num_positions, k]
        num_positions = hidden.shape[0]
        # The head and the loss run chunk by chunk on a detached copy of the hidden states; their
        # gradient is collected there and sent through the layers once at the end.
        hidden_leaf = hidden.detach().requires_grad_(True)
        loss_value, agreeing = 0.0, 0.0
        for start in range(0, num_positions, self.config.loss_chunk_tokens):
            chunk = slice(start, min(start + self.config.loss_chunk_tokens, num_positions))
            with autocast_context(self.device, self.autocast_dtype):
                logits = self.draft.logits(hidden_leaf[chunk])  # [chunk, num_outputs]
            chunk_mask = torch.ones(logits.shape[0], dtype=torch.bool, device=self.device)
            out = topk_kl(logits, teacher_ids[chunk], teacher_logprobs[chunk], chunk_mask, self.target_to_draft)
            share = out.num_positions / num_positions
            (out.loss * share).backward()
            loss_value += float(out.loss.detach()) * share
            agreeing += out.top1_agreement * out.num_positions
        hidden.backward(hidden_leaf.grad)
        grad_norm = self._finish_step(loss_value)
        return {"step": self.step, "loss": loss_value, "top1": agreeing / max(num_positions, 1), "lr": lr,
                "grad_norm": grad_norm, "tokens": num_positions}

    def train(self, stop_at: int | None = None) -> list[float]:
        """Runs until config.steps (or stop_at, for tests and chunked runs); returns the losses
        of the steps run by this call."""
        end = min(self.config.steps, stop_at if stop_at is not None else self.config.steps)
        first_loss_index = len(self.losses)
        log_path = os.path.join(self.run_dir, LOG_FILE)
        os.makedirs(self.run_dir, exist_ok=True)
        window: list[dict[str, float]] = []
        started = time.monotonic()
        with tqdm(total=self.config.steps, initial=self.step, desc="distill", unit="step",
                  disable=not self.progress) as bar, open(log_path, "a", encoding="utf-8") as log:
            while self.step < end:
                metrics = self.train_step()
                window.append(metrics)
                bar.update(1)
                if self.step % self.config.log_every == 0 or self.step == end:
                    summary = _summarise(window, time.monotonic() - started)
                    bar.set_postfix(loss=f"{summary['loss']:.4f}", top1=f"{summary['top1']:.3f}")
                    log.write(json.dumps(summary) + "\n")
                    log.flush()
                    window = []
                    started = time.monotonic()
                if self.step % self.config.checkpoint_every == 0 or self.step == end:
                    self.save()
        return self.losses[first_loss_index:]


def _summarise(window: list[dict[str, float]], seconds: float) -> dict[str, Any]:
    tokens = sum(m["tokens"] for m in window)
    return {"step": int(window[-1]["step"]), "loss": sum(m["loss"] for m in window) / len(window),
            "top1": sum(m["top1"] * m["tokens"] for m in window) / max(tokens, 1), "lr": window[-1]["lr"],
            "grad_norm": window[-1]["grad_norm"], "tokens_per_s": tokens / max(seconds, 1e-9), "time": time.time(),
            # An EAGLE head's second unrolled pass (drafts/eagle.py): top-1 from its own predicted states.
            **({"top1_second": sum(m["top1_second"] * m["tokens"] for m in window) / max(tokens, 1)}
               if all("top1_second" in m for m in window) else {})}
