"""The distillation run end to end: target -> draft init -> teacher targets -> training -> export.

`DistillOptions` is everything `python -m drafts distill` takes; `run_distillation` is what it
does. A run folder holds the checkpoint, the training log and the draft's description, so the
same command started again resumes where the last one stopped (after a kill -9 too).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass

import torch

from engine.model.loader import load_model
from engine.model.resolve import resolve_model
from engine.spec_decode.draft_model import load_draft_model

from drafts.checkpoint import DraftMeta, load_checkpoint
from drafts.data.corpus import Corpus
from drafts.eagle import EagleDistiller, TrainableEagle, init_eagle
from drafts.export import export_draft, read_draft_folder
from drafts.features import FeatureCache
from drafts.init_draft import DraftInit, init_from_checkpoint, init_from_target, parse_layer_ids
from drafts.model import TrainableLlama
from drafts.target import Target, load_target, pick_device, wrap_engine_model
from drafts.teacher import OnTheFlyTeacher, TeacherCache, TeacherSource
from drafts.train import Distiller, TrainConfig, resolve_autocast
from drafts.vocab import count_tokens, select_draft_vocab, target_to_draft_map

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class DistillOptions:
    target: str | None  # None: the embedded SmolLM2-135M-Instruct
    data_dir: str
    run_dir: str
    layers: str | None = None  # "0,15,29" or a count spread over the target; None: 3 (an EAGLE head: the last layer)
    init_checkpoint: str | None = None  # another model (same tokenizer) to take the layers from
    shared_embedding: bool = True
    draft_vocab_size: int | None = None  # None: the full vocabulary
    # A draft folder whose draft vocabulary to keep (instead of the corpus's most frequent
    # tokens): continuing a head on a corpus weighted toward one kind of text would otherwise
    # narrow its vocabulary to that kind.
    draft_vocab_from: str | None = None
    top_k: int = 64
    teacher: str = "precompute"  # "precompute" (cached top-k) or "online"
    teacher_batch_size: int = 8
    device: str = "auto"
    target_dtype: str = "auto"  # the teacher's weights: auto = bfloat16 on CUDA, float32 on CPU
    autocast: str = "auto"
    export_dir: str | None = None
    export_dtype: str = "bfloat16"
    train: TrainConfig = TrainConfig()
    eagle: bool = False  # train an EAGLE-style head over the target's hidden states (drafts/eagle.py)
    unroll: int = 2  # an EAGLE head's training passes (2: also from its own predicted states)

    def __post_init__(self) -> None:
        if self.eagle and not self.shared_embedding:
            raise ValueError("an EAGLE head shares the target's embedding and head")
        if self.teacher not in ("precompute", "online"):
            raise ValueError(f"teacher must be 'precompute' or 'online', got {self.teacher!r}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.export_dtype not in _DTYPES:
            raise ValueError(f"export_dtype must be one of {', '.join(_DTYPES)}, got {self.export_dtype!r}")
        if self.draft_vocab_size is not None and self.draft_vocab_from is not None:
            raise ValueError("give draft_vocab_size or draft_vocab_from, not both")
        if self.target_dtype != "auto" and self.target_dtype not in _DTYPES:
            raise ValueError(f"target_dtype must be 'auto' or one of {', '.join(_DTYPES)}, got {self.target_dtype!r}")


def target_dtype(setting: str, device: torch.device) -> torch.dtype:
    if setting == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return _DTYPES[setting]


def build_draft(options: DistillOptions, target: Target, corpus: Corpus) -> tuple[TrainableLlama, DraftMeta]:
    """A fresh draft, or the one a checkpoint in the run folder describes (same vocabulary)."""
    payload = load_checkpoint(options.run_dir)
    if payload is not None:
        meta = DraftMeta.from_dict(payload["meta"])
        if meta.kind != ("eagle" if options.eagle else "layers"):
            raise ValueError(f"run folder {options.run_dir!r} holds a checkpoint of a {meta.kind!r} draft: "
                             "use a new --run folder")
        vocab_ids = meta.vocab_ids
        layer_ids = tuple(meta.layer_ids)
    else:
        vocab_ids = None
        if options.draft_vocab_size is not None:
            counts = count_tokens(corpus.tokens, target.arch.vocab_size)
            vocab_ids = select_draft_vocab(counts, options.draft_vocab_size, target.tokenizer.all_special_ids)
        elif options.draft_vocab_from is not None:
            vocab_ids = _folder_vocab(options.draft_vocab_from, target)
        layer_ids = None
    if options.eagle:
        # One layer: --layers names it (a bare number is a layer id here, not a count).
        if not layer_ids:
            try:
                layer_ids = (int(options.layers),) if options.layers else (target.arch.num_hidden_layers - 1,)
            except ValueError:
                raise ValueError(f"an EAGLE head has one layer: --layers names one target layer, "
                                 f"got {options.layers!r}") from None
        draft = init_eagle(target, layer_ids[0], vocab_ids)
        source = "target"
        if options.init_checkpoint is not None and payload is None:
            _warm_start_eagle(draft, options.init_checkpoint, target)
            source = options.init_checkpoint
        meta = DraftMeta(target=target.name, arch=draft.arch, shared_embedding=True, layer_ids=list(layer_ids),
                         vocab_ids=vocab_ids, init_source=source, kind="eagle")
        return draft, meta
    if options.init_checkpoint is None:
        layer_ids = layer_ids or parse_layer_ids(options.layers or "3", target.arch.num_hidden_layers)
        init = DraftInit(layer_ids, options.shared_embedding, vocab_ids)
        draft = init_from_target(target, init)
        source = "target"
    else:
        source_model, source_arch = load_model(resolve_model(options.init_checkpoint), torch.float32, target.device)
        layer_ids = layer_ids or parse_layer_ids(options.layers or "3", source_arch.num_hidden_layers)
        init = DraftInit(layer_ids, options.shared_embedding, vocab_ids)
        draft = init_from_checkpoint(source_model, target, init)
        del source_model
        source = options.init_checkpoint
    meta = DraftMeta(target=target.name, arch=draft.arch, shared_embedding=options.shared_embedding,
                     layer_ids=list(layer_ids), vocab_ids=vocab_ids, init_source=source)
    return draft, meta


def _folder_vocab(folder: str, target: Target) -> torch.Tensor:  # [Vd] int64 sorted target ids
    """The draft vocabulary of an exported draft folder, checked against the target."""
    vocab_ids = read_draft_folder(folder)[3]
    if vocab_ids is None:
        raise ValueError(f"draft folder {folder!r} has no reduced vocabulary to keep (it drafts over the full one)")
    if int(vocab_ids.max()) >= target.arch.vocab_size:
        raise ValueError(f"draft folder {folder!r}: its vocabulary holds ids past the target's "
                         f"{target.arch.vocab_size}")
    missing = set(target.tokenizer.all_special_ids) - set(vocab_ids.tolist())
    if missing:  # end of turn must stay proposable (drafts/vocab.py)
        raise ValueError(f"draft folder {folder!r}: its vocabulary lacks the special tokens {sorted(missing)}")
    return vocab_ids


def _warm_start_eagle(head: TrainableEagle, folder: str, target: Target) -> None:
    """Continues an exported EAGLE head (its layer, norm and fc; the vocabulary may differ: the
    output rows are the target's head either way), e.g. to train it further on more data."""
    source = load_draft_model(folder, target.engine_model, target.arch, torch.float32, target.device,
                              inference_only=False)
    if source.fc_weight is None:
        raise ValueError(f"--init-checkpoint {folder!r} with --eagle must be an exported EAGLE head")
    params = dict(source.model.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for name, param in head.layers[0].named_parameters():
            param.copy_(params[f"layers.0.{name}"])
        head.norm.weight.copy_(source.model.norm.weight)
        head.fc.weight.copy_(source.fc_weight)


def run_distillation(options: DistillOptions, *, progress: bool = True) -> Distiller:
    device = pick_device(options.device)
    corpus = Corpus.load(options.data_dir)
    target = load_target(options.target, device=device, dtype=target_dtype(options.target_dtype, device),
                         progress=progress)
    autocast_dtype = resolve_autocast(options.autocast, device)
    teacher_model = wrap_engine_model(target.engine_model)
    online = OnTheFlyTeacher(teacher_model, options.top_k, autocast_dtype=autocast_dtype)
    teacher: TeacherSource = online
    features = FeatureCache(options.data_dir, corpus, target.arch.hidden_size, target.name) if options.eagle else None
    if options.teacher == "precompute":
        cache = TeacherCache(options.data_dir, corpus, options.top_k, target.name)
        # An EAGLE head needs the target's states too: the same forward fills both caches.
        cache.precompute(online, batch_size=options.teacher_batch_size, device=device, features=features)
        teacher = cache
    draft, meta = build_draft(options, target, corpus)
    os.makedirs(options.run_dir, exist_ok=True)
    with open(os.path.join(options.run_dir, "options.json"), "w", encoding="utf-8") as f:
        json.dump({**asdict(options), "layer_ids": meta.layer_ids,
                   "num_trainable_params": sum(p.numel() for p in draft.parameters() if p.requires_grad)}, f, indent=2)
    mapping = None if meta.vocab_ids is None else target_to_draft_map(meta.vocab_ids.to(device), target.arch.vocab_size)
    if features is not None:
        features.precompute(teacher_model, batch_size=options.teacher_batch_size, device=device,
                            autocast_dtype=autocast_dtype, progress=progress)
        distiller: Distiller = EagleDistiller(draft, teacher, corpus, options.train, options.run_dir, meta,
                                              features=features, target_to_draft=mapping,
                                              autocast_dtype=autocast_dtype, unroll=options.unroll, progress=progress)
    else:
        distiller = Distiller(draft, teacher, corpus, options.train, options.run_dir, meta, target_to_draft=mapping,
                              autocast_dtype=autocast_dtype, progress=progress)
    distiller.train()
    if options.export_dir is not None:
        export_draft(draft, options.export_dir, target_name=target.name, shared_embedding=options.shared_embedding,
                     dtype=_DTYPES[options.export_dtype])
    return distiller


def export_run(run_dir: str, out_dir: str, *, dtype: str = "bfloat16") -> None:
    """Exports the latest checkpoint of a run. No target needed: a shared-embedding draft
    stores nothing of the target's, and one with its own embedding has it in the checkpoint."""
    payload = load_checkpoint(run_dir)
    if payload is None:
        raise FileNotFoundError(f"run folder {run_dir!r} has no checkpoint")
    meta = DraftMeta.from_dict(payload["meta"])
    kind = TrainableEagle if meta.kind == "eagle" else TrainableLlama
    draft = kind(meta.arch, vocab_ids=meta.vocab_ids, dtype=torch.float32, device="cpu")
    state = payload["model"]
    with torch.no_grad():
        for name, param in draft.named_parameters():
            if name in state:
                param.copy_(state[name])
            elif not meta.shared_embedding:
                raise ValueError(f"checkpoint in {run_dir!r} lacks {name!r}")
    export_draft(draft, out_dir, target_name=meta.target, shared_embedding=meta.shared_embedding, dtype=_DTYPES[dtype])
