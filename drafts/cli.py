"""`python -m drafts data|distill|export|eval|suffix-corpus`: the draft pipeline's command line.

    python -m drafts data    --out runs/d/data            # stdlib + target transcripts + held-out prompts
    python -m drafts distill --data runs/d/data --run runs/d/train --export drafts/smollm2-135m-draft
    python -m drafts export  --run runs/d/train --out drafts/smollm2-135m-draft
    python -m drafts eval    --data runs/d/data --draft drafts/smollm2-135m-draft --out runs/d/eval
    python -m drafts suffix-corpus --data runs/d/data --out drafts/smollm2-135m-suffix-corpus.npy

--target names the target as the engine does (nothing: the embedded SmolLM2-135M-Instruct; a
GGUF file; a Hugging Face folder). Every command can be stopped and started again: data reuses
the transcripts it cached, distill resumes from the run folder's checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import fields

import torch

from drafts.train import TrainConfig


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=None,
                        help="target model: a GGUF file or Hugging Face folder (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    parser.add_argument("--kv-cache-memory", default=None,
                        help="KV budget of the engine that generates (e.g. 2GiB; default: the engine's)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m drafts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    data = sub.add_parser("data", help="build the distillation corpus and held-out prompts")
    _add_target(data)
    data.add_argument("--out", required=True, help="data folder")
    from drafts.data.corpus import DataConfig
    for f in fields(DataConfig):
        data.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    data.add_argument("--engine-dtype", default="auto", help="dtype the engine generates in (auto, float32, bfloat16)")
    data.add_argument("--max-num-seqs", type=int, default=64, help="engine batch size while generating")

    distill = sub.add_parser("distill", help="train a draft on a data folder (resumes from --run)")
    _add_target(distill)
    distill.add_argument("--data", required=True, help="data folder built by `data`")
    distill.add_argument("--run", required=True, help="run folder: checkpoint, log, options")
    distill.add_argument("--layers", default=None,
                         help="target layers to start from: '0,15,29', or a count spread evenly (default 3; "
                              "with --eagle the one layer the head starts from, default the last)")
    distill.add_argument("--eagle", action="store_true",
                         help="train an EAGLE-style head (one layer over the target's hidden states) instead of "
                              "a small standalone draft")
    distill.add_argument("--unroll", type=int, default=2, choices=(1, 2),
                         help="EAGLE head: training passes (2 also trains from its own predicted states)")
    distill.add_argument("--init-checkpoint", default=None,
                         help="take the layers from this model instead (same tokenizer, e.g. Qwen3-0.6B); "
                              "with --eagle, an exported EAGLE head to train further")
    distill.add_argument("--no-shared-embedding", action="store_true",
                         help="train the draft's own embedding and head instead of borrowing the target's")
    distill.add_argument("--draft-vocab-size", type=int, default=None,
                         help="reduced output vocabulary: the data's most frequent tokens (default: full)")
    distill.add_argument("--draft-vocab-from", default=None, metavar="DRAFT_FOLDER",
                         help="keep this exported draft's reduced vocabulary instead (e.g. the head that "
                              "--init-checkpoint continues, on data weighted toward one kind of text)")
    distill.add_argument("--top-k", type=int, default=64, help="teacher tokens per position (the rest is one tail bucket)")
    distill.add_argument("--teacher", choices=("precompute", "online"), default="precompute")
    distill.add_argument("--teacher-batch-size", type=int, default=8)
    distill.add_argument("--target-dtype", default="auto", help="teacher weights: auto (bf16 on CUDA, fp32 on CPU), ...")
    distill.add_argument("--autocast", default="auto", help="auto (bf16 on CUDA and on CPUs with AMX or AVX512-BF16), bf16, fp16, none")
    distill.add_argument("--export", default=None, help="draft folder to write when training ends")
    distill.add_argument("--export-dtype", default="bfloat16")
    for f in fields(TrainConfig):
        distill.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)

    export = sub.add_parser("export", help="write a run's latest checkpoint as a draft folder")
    export.add_argument("--run", required=True)
    export.add_argument("--out", required=True)
    export.add_argument("--dtype", default="bfloat16")

    evaluate = sub.add_parser("eval", help="acceptance of a draft on held-out code, chat and tool prompts")
    _add_target(evaluate)
    evaluate.add_argument("--data", required=True, help="data folder (its heldout.jsonl)")
    group = evaluate.add_mutually_exclusive_group(required=True)
    group.add_argument("--draft", help="draft folder")
    group.add_argument("--identity", action="store_true", help="use the target itself as the draft (sanity check)")
    group.add_argument("--layers", help="an untrained draft made of these target layers (baseline)")
    evaluate.add_argument("--out", default=None, help="folder for the report and cached continuations")
    evaluate.add_argument("--report", default=None, help="report file (default: OUT/report.json)")
    evaluate.add_argument("--max-new-tokens", type=int, default=128)
    evaluate.add_argument("--max-k", type=int, default=8)
    evaluate.add_argument("--num-prompts", type=int, default=None, help="per kind (default: all held-out prompts)")
    evaluate.add_argument("--engine-dtype", default="float32",
                          help="dtype of the target's continuations (float32: the reference)")
    evaluate.add_argument("--seed", type=int, default=0)

    corpus = sub.add_parser("suffix-corpus", help="the target's answers in a data folder's transcripts, as a "
                                                  "corpus for suffix drafting (--suffix-corpus)")
    _add_target(corpus)
    corpus.add_argument("--data", required=True, help="data folder built by `data` (its transcripts/)")
    corpus.add_argument("--out", required=True, help=".npy file to write")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    if args.command == "data":
        return _data(args)
    if args.command == "distill":
        return _distill(args)
    if args.command == "suffix-corpus":
        return _suffix_corpus(args)
    if args.command == "export":
        from drafts.pipeline import export_run

        export_run(args.run, args.out, dtype=args.dtype)
        print(f"wrote {args.out}")
        return 0
    return _eval(args)


def _data(args: argparse.Namespace) -> int:
    from engine.llm import LLM

    from drafts.data.corpus import DataConfig, build_corpus
    from drafts.data.transcripts import TranscriptGenerator

    config = DataConfig(**{f.name: getattr(args, f.name) for f in fields(DataConfig)})
    llm = LLM(args.target, dtype=args.engine_dtype, device=args.device, max_num_seqs=args.max_num_seqs,
              num_threads=args.threads, kv_cache_memory=args.kv_cache_memory)
    generator = TranscriptGenerator(llm, max_new_tokens=config.max_new_tokens, seed=config.seed,
                                    batch_size=config.generation_batch_size)
    corpus = build_corpus(args.out, config, llm.tokenizer, generator)
    print(json.dumps({"num_windows": corpus.num_windows, "num_tokens": corpus.num_tokens,
                      "tokens_per_kind": corpus.tokens_per_kind()}, indent=2))
    return 0


def _distill(args: argparse.Namespace) -> int:
    from drafts.pipeline import DistillOptions, run_distillation

    train = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    options = DistillOptions(
        target=args.target, data_dir=args.data, run_dir=args.run, layers=args.layers,
        init_checkpoint=args.init_checkpoint, shared_embedding=not args.no_shared_embedding,
        draft_vocab_size=args.draft_vocab_size, draft_vocab_from=args.draft_vocab_from, top_k=args.top_k,
        teacher=args.teacher, teacher_batch_size=args.teacher_batch_size, device=args.device,
        target_dtype=args.target_dtype,
        autocast=args.autocast, export_dir=args.export, export_dtype=args.export_dtype, train=train,
        eagle=args.eagle, unroll=args.unroll,
    )
    distiller = run_distillation(options)
    print(json.dumps({"step": distiller.step, "last_loss": distiller.losses[-1] if distiller.losses else None}))
    return 0


def _draft_kind(folder: str) -> str:
    """A draft folder's kind ("layers" or "eagle"); a GGUF file is a standalone draft."""
    config = os.path.join(folder, "config.json")
    if not os.path.isfile(config):
        return "layers"
    with open(config, encoding="utf-8") as f:
        return (json.load(f).get("draftgate") or {}).get("kind", "layers")


def _suffix_corpus(args: argparse.Namespace) -> int:
    from engine.model.resolve import resolve_model
    from engine.model.tokenizer import load_tokenizer

    from drafts.suffix_corpus import write_suffix_corpus

    counts = write_suffix_corpus(args.data, args.out, load_tokenizer(resolve_model(args.target)))
    print(f"wrote {args.out}: " + ", ".join(f"{name} {count}" for name, count in counts.items()))
    return 0


def _eval(args: argparse.Namespace) -> int:
    from engine.llm import LLM

    from drafts.data.corpus import read_heldout
    from drafts.evaluate import continuations, evaluate_acceptance, evaluate_eagle_acceptance, format_report
    from drafts.export import load_draft
    from drafts.init_draft import DraftInit, init_from_target, parse_layer_ids
    from drafts.target import load_target, pick_device, wrap_engine_model

    device = pick_device(args.device)
    prompts = read_heldout(args.data)
    if args.num_prompts is not None:
        taken: dict[str, int] = {}
        kept = []
        for kind, ids in prompts:
            if taken.get(kind, 0) < args.num_prompts:
                kept.append((kind, ids))
                taken[kind] = taken.get(kind, 0) + 1
        prompts = kept
    target = load_target(args.target, device=device, dtype=torch.float32)
    teacher = wrap_engine_model(target.engine_model)
    eagle = None
    if args.draft and _draft_kind(args.draft) == "eagle":
        from engine.spec_decode.draft_model import load_draft_model
        from engine.spec_decode.eagle import EagleProposer

        head = load_draft_model(args.draft, target.engine_model, target.arch, torch.float32, device)
        longest = max(len(p) for _, p in prompts) + args.max_new_tokens + args.max_k
        eagle = EagleProposer(head, num_blocks=-(-longest // 16), block_size=16, device=device, dtype=torch.float32)
        draft = None
    elif args.identity:
        draft = teacher
    elif args.layers:
        draft = init_from_target(target, DraftInit(parse_layer_ids(args.layers, target.arch.num_hidden_layers), True))
    else:
        draft, _ = load_draft(args.draft, target)
    if draft is not None:
        draft.eval()
    llm = LLM(args.target, dtype=args.engine_dtype, device=args.device, num_threads=args.threads,
              kv_cache_memory=args.kv_cache_memory)
    ids = [p for _, p in prompts]
    cache_dir = args.out
    greedy = continuations(llm, ids, temperature=0.0, max_new_tokens=args.max_new_tokens, seed=args.seed,
                           cache_path=os.path.join(cache_dir, "continuations_greedy.json") if cache_dir else None)
    sampled = None if eagle is not None else continuations(  # (a head is replayed greedy only)
        llm, ids, temperature=1.0, max_new_tokens=args.max_new_tokens, seed=args.seed,
        cache_path=os.path.join(cache_dir, "continuations_t1.json") if cache_dir else None)
    del llm
    if eagle is not None:
        report = evaluate_eagle_acceptance(eagle, teacher, prompts, greedy, max_k=args.max_k)
    else:
        report = evaluate_acceptance(draft, teacher, prompts, greedy, sampled, max_k=args.max_k, device=device)
    report["draft"] = "identity" if args.identity else (f"layers {args.layers}" if args.layers else args.draft)
    report["num_prompts"] = {kind: sum(1 for k, _ in prompts if k == kind) for kind in ("code", "chat", "tool")}
    report["max_new_tokens"] = args.max_new_tokens
    print(format_report(report))
    report_path = args.report or (os.path.join(args.out, "report.json") if args.out else None)
    if report_path:
        os.makedirs(os.path.dirname(report_path) or ".", exist_ok=True)
        with open(report_path, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
