"""An EAGLE-style draft head: one decoder layer over the target's own hidden states.

An independent small draft must rediscover from tokens alone what the target already computed;
a head that reads the target's final hidden state h_t (the vector its output head turns into
token t + 1) only has to carry it one token further. At position t the head's input is
fc([embed(token_{t+1}); h_t]), its output after one llama decoder layer and a final norm is a
prediction of h_{t+1}, and the target's output head (restricted to the draft vocabulary) turns
that into the draft of token t + 2. The next draft feeds the predicted state back in place of
the target's, so k drafts cost k one-layer steps (Li et al., EAGLE, 2024).

Training (`EagleDistiller`): teacher-forced on the corpus with the target's stored hidden
states (drafts/features.py): a smooth-L1 regression of the predicted state onto h_{t+1} plus the
top-k KL of its logits against the teacher's distribution of token t + 2, weighted 1.0 and 1.0
(the EAGLE paper weights the KL 0.1 over long GPU runs; in the few hundred steps a CPU affords,
top-1 agreement rose faster with the KL weighted as much as the regression). With `unroll` 2 a second pass feeds the first pass's predicted
states back in (the states the second draft of a step sees at serving time) and adds the same
losses, so the head learns to continue from its own predictions.

The trainable form reuses TrainableLlama (one layer, the target's frozen embedding and head rows)
and adds `fc`; the engine's form is engine/spec_decode/eagle.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.arch_config import ArchConfig

from drafts.checkpoint import DraftMeta
from drafts.data.corpus import Corpus
from drafts.features import FeatureCache
from drafts.init_draft import DraftInit, init_from_target
from drafts.loss import topk_kl
from drafts.model import TrainableLlama
from drafts.target import Target
from drafts.teacher import TeacherSource, autocast_context, pad_windows
from drafts.train import Distiller, TrainConfig

REGRESSION_WEIGHT = 1.0
CLASSIFICATION_WEIGHT = 1.0


class TrainableEagle(TrainableLlama):
    """forward: (next tokens [batch, seq], target states [batch, seq, hidden]) -> predicted next
    states [batch, seq, hidden] (final-norm, like the target's)."""

    def __init__(self, arch: ArchConfig, *, vocab_ids: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, max_positions: int | None = None) -> None:
        super().__init__(arch, vocab_ids=vocab_ids, dtype=dtype, device=device, max_positions=max_positions)
        hidden = arch.hidden_size
        # [hidden, 2 * hidden]: [embedding of the next token; the target's state] -> layer input.
        self.fc = nn.Linear(2 * hidden, hidden, bias=False, dtype=dtype, device=device)

    def init_fc(self) -> None:
        """Starts as embedding + state: the layer first sees a sum it can already read."""
        hidden = self.arch.hidden_size
        with torch.no_grad():
            eye = torch.eye(hidden, dtype=self.fc.weight.dtype, device=self.fc.weight.device)
            self.fc.weight.copy_(torch.cat([eye, eye], dim=1))

    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,  # [batch, seq] int64: token t + 1 at position t
        features: torch.Tensor,  # [batch, seq, hidden]: the (target's or predicted) state at t
        positions: torch.Tensor | None = None,  # [batch, seq] int64; None: 0 .. seq - 1
    ) -> torch.Tensor:  # [batch, seq, hidden]
        batch, seq = input_ids.shape
        if positions is None:
            positions = torch.arange(seq, device=input_ids.device).expand(batch, seq)
        dtype = self.norm.weight.dtype
        embedded = F.embedding(input_ids, self.embed_tokens.weight).to(dtype)
        hidden = self.fc(torch.cat([embedded, features.to(dtype)], dim=-1))
        autocast = torch.is_autocast_enabled(hidden.device.type)
        cos, sin = self.rotary.cos_sin(positions.reshape(-1),
                                       torch.get_autocast_dtype(hidden.device.type) if autocast else hidden.dtype)
        cos = cos.view(batch, seq, 1, -1)
        sin = sin.view(batch, seq, 1, -1)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin)
        return self.norm(hidden)


class EagleDistiller(Distiller):
    """Distiller's loop, checkpoints and batch order; the step is the head's (module docstring)."""

    def __init__(self, draft: TrainableEagle, teacher: TeacherSource, corpus: Corpus, config: TrainConfig,
                 run_dir: str, meta: DraftMeta, *, features: FeatureCache, target_to_draft: torch.Tensor | None,
                 autocast_dtype: torch.dtype | None, unroll: int = 2, progress: bool = True) -> None:
        if unroll not in (1, 2):
            raise ValueError(f"unroll must be 1 or 2, got {unroll}")
        self.features = features
        self.unroll = unroll
        super().__init__(draft, teacher, corpus, config, run_dir, meta, target_to_draft=target_to_draft,
                         autocast_dtype=autocast_dtype, progress=progress)

    def _pass_loss(self, predicted: torch.Tensor, target_states: torch.Tensor, teacher_ids: torch.Tensor,
                   teacher_logprobs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, float, int]:
        """(weighted loss, top-1 agreement, positions) of one pass over the masked positions."""
        rows = predicted[mask]  # [n, hidden]
        regression = F.smooth_l1_loss(rows.float(), target_states[mask])
        with autocast_context(self.device, self.autocast_dtype):
            logits = self.draft.logits(rows)  # [n, num_outputs]
        out = topk_kl(logits, teacher_ids[mask], teacher_logprobs[mask],
                      torch.ones(rows.shape[0], dtype=torch.bool, device=self.device), self.target_to_draft)
        return REGRESSION_WEIGHT * regression + CLASSIFICATION_WEIGHT * out.loss, out.top1_agreement, out.num_positions

    def train_step(self) -> dict[str, float]:
        indices = self.batch_indices(self.step)
        input_ids, lengths = pad_windows(self.corpus, indices, self.device)  # [batch, seq]
        seq = input_ids.shape[1]
        states = self.features.windows(indices, seq).to(self.device)  # [batch, seq, hidden]
        teacher_ids, teacher_logprobs = self.teacher.targets(indices, input_ids)  # [batch, seq, k]
        valid = torch.arange(seq, device=self.device)[None, :] < torch.tensor(lengths, device=self.device)[:, None]
        # Position t reads (token t + 1, state t) and predicts state t + 1, whose teacher row is
        # the distribution of token t + 2.
        next_ids, in_states = input_ids[:, 1:], states[:, :-1]
        out_states, out_ids, out_logprobs = states[:, 1:], teacher_ids[:, 1:], teacher_logprobs[:, 1:]
        mask = valid[:, 1:]  # [batch, seq - 1]
        lr = self._begin_step()
        with autocast_context(self.device, self.autocast_dtype):
            predicted = self.draft(next_ids, in_states)  # [batch, seq - 1, hidden]
        loss, top1, num_positions = self._pass_loss(predicted, out_states, out_ids, out_logprobs, mask)
        metrics = {"top1": top1}
        if self.unroll == 2:
            # The second draft of a step reads the first's predicted state: feed pass 1's
            # predictions back (position 0 keeps the target's; it has no prediction).
            fed = torch.cat([in_states[:, :1], predicted[:, :-1].float()], dim=1)
            with autocast_context(self.device, self.autocast_dtype):
                second = self.draft(next_ids, fed)
            mask2 = mask.clone()
            mask2[:, 0] = False
            loss2, top1_second, _ = self._pass_loss(second, out_states, out_ids, out_logprobs, mask2)
            loss = loss + loss2
            metrics["top1_second"] = top1_second
        loss.backward()
        loss_value = float(loss.detach())
        grad_norm = self._finish_step(loss_value)
        return {"step": self.step, "loss": loss_value, "lr": lr, "grad_norm": grad_norm,
                "tokens": num_positions, **metrics}


def init_eagle(target: Target, layer_id: int, vocab_ids: torch.Tensor | None) -> TrainableEagle:
    """A trainable head on the target's device, float32 master weights: its layer a copy of the
    target's layer `layer_id`, its norm the target's final norm, the target's embedding and
    head rows shared and frozen, fc = [I I]."""
    head = init_from_target(target, DraftInit((layer_id,), True, vocab_ids), model_class=TrainableEagle)
    head.init_fc()
    return head
