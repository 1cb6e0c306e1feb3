"""Architecture of a llama-family checkpoint: the shapes and switches the model is built from.

Read from a Hugging Face config.json (`from_hf_config`) or from a GGUF file's metadata
(`from_gguf`). The model runner also takes the KV-cache geometry from here
(num_hidden_layers, num_key_value_heads, head_dim).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Hugging Face `architectures` entry -> model family (its model_type).
_HF_FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_HF_FAMILIES)

# GGUF general.architecture -> Hugging Face architecture name.
_GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
SUPPORTED_GGUF_ARCHITECTURES: tuple[str, ...] = tuple(_GGUF_ARCHITECTURES)

# rope_scaling types the rotary layer implements (None / "default" mean unscaled).
SUPPORTED_ROPE_TYPES: tuple[str, ...] = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class ArchConfig:
    architecture: str  # one of SUPPORTED_ARCHITECTURES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    # Scaled RoPE parameters with a "rope_type" key (see layers/rotary.py); None: plain RoPE.
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # bias on the q/k/v projections (Qwen2; Llama's attention_bias)
    qk_norm: bool  # per-head RMSNorm of q and k before RoPE (Qwen3)
    sliding_window: int | None  # keys older than this many positions are not attended
    hidden_act: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    attention_output_bias: bool = False  # bias on o_proj (Llama's attention_bias covers it too)
    mlp_bias: bool = False  # bias on gate/up/down (Llama's mlp_bias)
    # Per-layer "sliding_attention" / "full_attention" (Qwen2/3 window only the upper layers);
    # None: every layer uses sliding_window.
    layer_types: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.architecture not in _HF_FAMILIES:
            raise ValueError(f"architecture {self.architecture!r} is not supported; supported: "
                             f"{', '.join(SUPPORTED_ARCHITECTURES)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"rms_norm_eps must be > 0, got {self.rms_norm_eps}")
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r} is not supported (only 'silu')")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or null, got {self.sliding_window}")
        if self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for "
                             f"{self.num_hidden_layers} layers (num_hidden_layers)")
        if self.rope_scaling is not None:
            rope_type = self.rope_scaling.get("rope_type")
            if rope_type not in SUPPORTED_ROPE_TYPES and rope_type != "freq_factors":
                raise ValueError(f"rope_scaling.type {rope_type!r} is not supported; supported: "
                                 f"{', '.join(SUPPORTED_ROPE_TYPES)}")

    def sliding_window_for_layer(self, layer_idx: int) -> int | None:
        if self.sliding_window is None:
            return None
        if self.layer_types is not None and self.layer_types[layer_idx] != "sliding_attention":
            return None
        return self.sliding_window

    # ---- Hugging Face config.json ---------------------------------------------------------------
    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ArchConfig:
        """Builds from a parsed config.json. Accepts both the classic keys (rope_theta,
        rope_scaling) and transformers 5's rope_parameters."""
        architecture = _hf_architecture(config)
        family = _HF_FAMILIES[architecture]
        num_heads = _required(config, "num_attention_heads")
        hidden_size = _required(config, "hidden_size")
        num_layers = _required(config, "num_hidden_layers")
        head_dim = config.get("head_dim") or hidden_size // num_heads

        sliding_window: int | None = config.get("sliding_window")
        layer_types: tuple[str, ...] | None = None
        if family in ("qwen2", "qwen3"):
            # Qwen ships a sliding_window value that is off unless use_sliding_window is true,
            # and then only for layers from max_window_layers on.
            if not config.get("use_sliding_window", False):
                sliding_window = None
            if sliding_window is not None:
                saved_types = config.get("layer_types")
                if saved_types is not None:
                    layer_types = tuple(saved_types)
                else:
                    first_sliding = config.get("max_window_layers", 28)
                    layer_types = tuple("sliding_attention" if i >= first_sliding else "full_attention"
                                        for i in range(num_layers))

        eos = config.get("eos_token_id")
        eos_token_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        # Llama and Qwen3 read attention_bias (q/k/v and o_proj); Mistral has no such switch.
        llama_bias = bool(config.get("attention_bias", False)) and family in ("llama", "qwen3")
        rope_theta, rope_scaling = _hf_rope(config, config.get("max_position_embeddings", 2048))
        return cls(
            architecture=architecture,
            vocab_size=_required(config, "vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=_required(config, "intermediate_size"),
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=config.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            attention_bias=True if family == "qwen2" else llama_bias,  # Qwen2 always has q/k/v biases
            attention_output_bias=llama_bias,
            qk_norm=family == "qwen3",
            sliding_window=sliding_window,
            hidden_act=config.get("hidden_act", "silu"),
            bos_token_id=config.get("bos_token_id"),
            eos_token_ids=eos_token_ids,
            mlp_bias=bool(config.get("mlp_bias", False)) if family == "llama" else False,
            layer_types=layer_types,
        )

    # ---- GGUF metadata ------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, reader: Any) -> ArchConfig:
        """Builds from a gguf.GGUFReader. Tying is read from the tensors (no output.weight
        means the embedding doubles as the lm_head); llama.cpp's rope_freqs tensor (Llama 3.x
        frequency factors) becomes rope_scaling {"rope_type": "freq_factors"}."""
        gguf_arch = _gguf_field(reader, "general.architecture")
        if gguf_arch not in _GGUF_ARCHITECTURES:
            raise ValueError(f"GGUF general.architecture {gguf_arch!r} is not supported; supported: "
                             f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}")
        tensors = {t.name: t for t in reader.tensors}
        if "token_embd.weight" not in tensors:
            raise ValueError("GGUF file has no token_embd.weight tensor")

        def key(name: str, default: Any = _MISSING) -> Any:
            return _gguf_field(reader, f"{gguf_arch}.{name}", default)

        hidden_size = int(key("embedding_length"))
        num_heads = int(key("attention.head_count"))
        head_dim = int(key("attention.key_length", 0)) or hidden_size // num_heads
        context_length = int(key("context_length"))
        rope_scaling = _gguf_rope_scaling(reader, gguf_arch, tensors, context_length)
        eos = _gguf_field(reader, "tokenizer.ggml.eos_token_id", None)
        bos = _gguf_field(reader, "tokenizer.ggml.bos_token_id", None)
        return cls(
            architecture=_GGUF_ARCHITECTURES[gguf_arch],
            # ne order is [hidden, vocab]: the embedding's row count is the vocabulary.
            vocab_size=int(tensors["token_embd.weight"].shape[1]),
            hidden_size=hidden_size,
            intermediate_size=int(key("feed_forward_length")),
            num_hidden_layers=int(key("block_count")),
            num_attention_heads=num_heads,
            num_key_value_heads=int(key("attention.head_count_kv", num_heads)),
            head_dim=head_dim,
            rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
            rope_theta=float(key("rope.freq_base", 10000.0)),
            rope_scaling=rope_scaling,
            max_position_embeddings=context_length,
            tie_word_embeddings="output.weight" not in tensors,
            attention_bias="blk.0.attn_q.bias" in tensors,
            attention_output_bias="blk.0.attn_output.bias" in tensors,
            qk_norm="blk.0.attn_q_norm.weight" in tensors,
            sliding_window=None,
            hidden_act="silu",
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=() if eos is None else (int(eos),),
        )


class _Missing:
    pass


_MISSING: Any = _Missing()


def _required(config: dict[str, Any], name: str) -> Any:
    if name not in config:
        raise ValueError(f"config.json has no {name!r}")
    return config[name]


def _hf_architecture(config: dict[str, Any]) -> str:
    names = list(config.get("architectures") or [])
    for name in names:
        if name in _HF_FAMILIES:
            return name
    if not names:
        # Configs saved without `architectures` still carry model_type.
        by_type = {family: arch for arch, family in _HF_FAMILIES.items()}
        if config.get("model_type") in by_type:
            return by_type[config["model_type"]]
    found = names or config.get("model_type")
    raise ValueError(f"architecture {found!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")


def _hf_rope(config: dict[str, Any], max_positions: int) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from the classic keys or transformers 5's rope_parameters."""
    params = dict(config.get("rope_parameters") or {})
    legacy = config.get("rope_scaling")
    if legacy:
        params = {**params, **legacy}
    rope_theta = float(params.pop("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if rope_type == "default":
        return rope_theta, None
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope_scaling.type {rope_type!r} is not supported; supported: "
                         f"{', '.join(SUPPORTED_ROPE_TYPES)}")
    if rope_type in ("llama3", "yarn"):
        params.setdefault("original_max_position_embeddings", max_positions)
    return rope_theta, {"rope_type": rope_type, **params}


def _gguf_field(reader: Any, name: str, default: Any = _MISSING) -> Any:
    field = reader.fields.get(name)
    if field is None:
        if default is _MISSING:
            raise ValueError(f"GGUF file has no {name!r} metadata")
        return default
    return field.contents()


def _gguf_rope_scaling(reader: Any, gguf_arch: str, tensors: dict[str, Any],
                       context_length: int) -> dict[str, Any] | None:
    if "rope_freqs.weight" in tensors:
        import numpy as np

        factors = np.asarray(tensors["rope_freqs.weight"].data, dtype=np.float32)
        return {"rope_type": "freq_factors", "factors": tuple(float(f) for f in factors)}
    scaling_type = _gguf_field(reader, f"{gguf_arch}.rope.scaling.type", "none")
    if scaling_type == "none":
        return None
    factor = float(_gguf_field(reader, f"{gguf_arch}.rope.scaling.factor", 1.0))
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"GGUF {gguf_arch}.rope.scaling.factor must be > 0, got {factor}")
    if scaling_type == "linear":
        return {"rope_type": "linear", "factor": factor}
    if scaling_type == "yarn":
        original = int(_gguf_field(reader, f"{gguf_arch}.rope.scaling.original_context_length",
                                   context_length / max(factor, 1.0)))
        scaling: dict[str, Any] = {"rope_type": "yarn", "factor": factor,
                                   "original_max_position_embeddings": original}
        beta_fast = _gguf_field(reader, f"{gguf_arch}.rope.scaling.yarn_beta_fast", None)
        beta_slow = _gguf_field(reader, f"{gguf_arch}.rope.scaling.yarn_beta_slow", None)
        if beta_fast:
            scaling["beta_fast"] = float(beta_fast)
        if beta_slow:
            scaling["beta_slow"] = float(beta_slow)
        return scaling
    raise ValueError(f"rope_scaling.type {scaling_type!r} (GGUF {gguf_arch}.rope.scaling.type) is not supported; "
                     f"supported: none, linear, yarn")
