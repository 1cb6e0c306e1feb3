"""Test helpers: tiny real targets (Hugging Face folders with random weights and a byte-level
tokenizer) that the engine's own loader reads, and small corpora. No mocks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def _byte_level_tokenizer() -> Tokenizer:
    """256 byte tokens (no merges) + the ChatML specials: encodes any text, vocabulary 259."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(alphabet)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return tokenizer


def write_tiny_target(folder: Path, *, architecture: str = "LlamaForCausalLM", num_layers: int = 4,
                      hidden_size: int = 64, intermediate_size: int = 128, num_heads: int = 4, num_kv_heads: int = 2,
                      tie: bool = True, seed: int = 0, extra_config: dict[str, Any] | None = None) -> Path:
    """A Hugging Face checkpoint folder the engine loads: random weights large enough that
    logits spread, norm weights away from 1 so a dropped norm shows."""
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = _byte_level_tokenizer()
    vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    head_dim = hidden_size // num_heads
    qwen2 = architecture == "Qwen2ForCausalLM"
    qwen3 = architecture == "Qwen3ForCausalLM"
    config = {
        "architectures": [architecture], "vocab_size": vocab_size, "hidden_size": hidden_size,
        "intermediate_size": intermediate_size, "num_hidden_layers": num_layers, "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads, "head_dim": head_dim, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 4096, "tie_word_embeddings": tie, "hidden_act": "silu",
        "bos_token_id": None, "eos_token_id": vocab_size - 1, **(extra_config or {}),
    }
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape: int, norm: bool = False) -> torch.Tensor:
        noise = torch.randn(*shape, generator=generator)
        return 1.0 + 0.2 * noise if norm else 0.15 * noise

    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    tensors = {"model.embed_tokens.weight": rand(vocab_size, hidden_size), "model.norm.weight": rand(hidden_size, norm=True)}
    if not tie:
        tensors["lm_head.weight"] = rand(vocab_size, hidden_size)
    for i in range(num_layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": rand(hidden_size, norm=True),
            p + "post_attention_layernorm.weight": rand(hidden_size, norm=True),
            p + "self_attn.q_proj.weight": rand(q, hidden_size), p + "self_attn.k_proj.weight": rand(kv, hidden_size),
            p + "self_attn.v_proj.weight": rand(kv, hidden_size), p + "self_attn.o_proj.weight": rand(hidden_size, q),
            p + "mlp.gate_proj.weight": rand(intermediate_size, hidden_size),
            p + "mlp.up_proj.weight": rand(intermediate_size, hidden_size),
            p + "mlp.down_proj.weight": rand(hidden_size, intermediate_size),
        })
        if qwen2:
            for name, size in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
                tensors[f"{p}self_attn.{name}.bias"] = rand(size)
        if qwen3:
            tensors[p + "self_attn.q_norm.weight"] = rand(head_dim, norm=True)
            tensors[p + "self_attn.k_norm.weight"] = rand(head_dim, norm=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    with open(folder / "config.json", "w", encoding="utf-8") as f:
        json.dump(config, f)
    tokenizer.save(str(folder / "tokenizer.json"))
    with open(folder / "tokenizer_config.json", "w", encoding="utf-8") as f:
        json.dump({"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": None}, f)
    return folder


def corpus_from_text(tokenizer: Any, texts: list[str], seq_len: int):  # -> Corpus
    from drafts.data.corpus import Corpus

    return Corpus.from_documents([("stdlib", tokenizer.encode(t)) for t in texts], seq_len)


def engine_logits(model: Any, sequences: list[list[int]], block_size: int = 4) -> list[torch.Tensor]:
    """The engine model's logits for every token of each sequence, all prefilled in one varlen
    step over a paged cache with scattered blocks (the model runner's path)."""
    from engine.model.attention_metadata import AttentionMetadata

    arch = model.arch
    dtype = model.embed_tokens.weight.dtype
    blocks_needed = [(len(s) + block_size - 1) // block_size for s in sequences]
    num_blocks = sum(blocks_needed) + 3
    # Reversed ids: every sequence's blocks are non-contiguous from its point of view.
    free = list(range(num_blocks))[::-1]
    block_ids = [[free.pop() for _ in range(n)][::-1] for n in blocks_needed]
    kv = [torch.zeros(2, num_blocks, arch.num_key_value_heads, block_size, arch.head_dim, dtype=dtype)
          for _ in range(arch.num_hidden_layers)]
    meta = AttentionMetadata.build(query_lens=[len(s) for s in sequences], seq_lens=[len(s) for s in sequences],
                                   block_ids=block_ids, block_size=block_size, device="cpu")
    input_ids = torch.tensor([t for s in sequences for t in s], dtype=torch.int64)
    positions = torch.tensor([p for s in sequences for p in range(len(s))], dtype=torch.int64)
    with torch.inference_mode():
        logits = model.compute_logits(model(input_ids, positions, kv, meta))
    out, start = [], 0
    for s in sequences:
        out.append(logits[start: start + len(s)])
        start += len(s)
    return out
