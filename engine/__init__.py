"""draftgate's engine. `from engine import LLM, SamplingParams`.

Exports are resolved lazily so that torch-free users (the gateway, engine.protocol, engine.core)
never import torch by importing this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.llm import LLM

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
