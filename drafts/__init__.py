"""Draft models for speculative decoding: distillation from a target, evaluation, export.

Layout: model.py (the trainable llama-family model), target.py (the target through the
engine's loader, and its teacher view), init_draft.py (drafts from target layers or another
checkpoint), data/ (stdlib sources, written prompts, target transcripts, the token corpus),
teacher.py and loss.py (top-k teacher targets, KL with a tail bucket), vocab.py (reduced
draft vocabulary), train.py and checkpoint.py (the resumable loop), export.py (the draft
folder format), evaluate.py (acceptance on held-out prompts), eagle.py and features.py (EAGLE
heads over the target's hidden states, and those states precomputed), pipeline.py and cli.py
(`python -m drafts data|distill|export|eval`). The shipped draft of the embedded model is the
EAGLE head in smollm2-135m-eagle/ (the earlier 3-layer draft: smollm2-135m-draft/). The engine
never imports this package; it reads the folder format.
"""
