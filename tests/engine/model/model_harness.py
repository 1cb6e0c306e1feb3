"""Test helpers: tiny random Hugging Face models as an independent reference, and a driver that
runs our model step by step through a paged KV cache (prefill, chunked prefill, decode).

The driver is not a mock: it plays the model runner's part (block tables, slot mapping,
positions) with AttentionMetadata.build, and gives every request scattered, non-contiguous
blocks so that a block-table bug shows up as wrong logits.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from engine.model.arch_config import ArchConfig
from engine.model.attention_metadata import AttentionMetadata
from engine.model.llama import LlamaForCausalLM

TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5)

# name -> (transformers config class, overrides). Each exercises one family switch.
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama_tied": ("LlamaConfig", dict(num_hidden_layers=2, tie_word_embeddings=True,
                                       bos_token_id=1, eos_token_id=2)),
    "qwen2_bias": ("Qwen2Config", dict(num_hidden_layers=3, tie_word_embeddings=False,
                                       eos_token_id=[5, 7])),
    "qwen2_sliding": ("Qwen2Config", dict(num_hidden_layers=3, use_sliding_window=True, sliding_window=4,
                                          max_window_layers=1, tie_word_embeddings=False)),
    "qwen3_qk_norm": ("Qwen3Config", dict(num_hidden_layers=2, head_dim=32, num_key_value_heads=1,
                                          tie_word_embeddings=False)),
    "mistral_window": ("MistralConfig", dict(num_hidden_layers=2, sliding_window=5, tie_word_embeddings=False)),
    "llama_rope_llama3": ("LlamaConfig", dict(
        num_hidden_layers=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "llama_rope_yarn": ("LlamaConfig", dict(
        num_hidden_layers=2, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 32})),
}


def tiny_hf_config(family: str, **overrides):  # -> transformers.PretrainedConfig
    import transformers

    class_name, family_overrides = FAMILIES[family]
    config_class = getattr(transformers, class_name)
    kwargs = {**TINY, **family_overrides, **overrides}
    config = config_class(**kwargs)
    config.architectures = [class_name.replace("Config", "ForCausalLM")]
    return config


def random_hf_model(config, seed: int = 0):  # -> transformers.PreTrainedModel, float32, eval
    """Weights large enough that logits spread (no near-ties for greedy decoding), and norm
    weights and biases away from their 1/0 init so that a dropped one changes the output."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if "norm" in name:
                param.copy_(1.0 + 0.2 * noise)
            else:
                param.copy_(0.15 * noise)
    return model.float().eval()


def tiny_model(family: str = "qwen2_bias", dtype: torch.dtype = torch.float32, **overrides) -> LlamaForCausalLM:
    """Our model with a tiny random Hugging Face model's weights (q/k/v and gate/up fused as
    our loaders fuse them), in eval mode and in its training form (plain Linears)."""
    hf = random_hf_model(tiny_hf_config(family, **overrides), seed=0)
    arch = ArchConfig.from_hf_config(hf.config.to_dict())
    model = LlamaForCausalLM(arch, dtype=dtype)
    state = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("qkv_proj.weight") or name.endswith("qkv_proj.bias"):
                base, kind = name.rsplit(".", 2)[0], name.rsplit(".", 1)[1]
                parts = [state[f"{base}.{p}_proj.{kind}"] for p in "qkv"]
                param.copy_(torch.cat(parts))
            elif name.endswith("gate_up_proj.weight"):
                base = name.rsplit(".", 2)[0]
                param.copy_(torch.cat([state[f"{base}.gate_proj.weight"], state[f"{base}.up_proj.weight"]]))
            else:
                param.copy_(state[name])
    return model.eval()


def hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:  # [len(token_ids), vocab] float32
    with torch.no_grad():
        return hf_model(torch.tensor([token_ids])).logits[0].float()


def hf_greedy(hf_model, token_ids: list[int], num_new_tokens: int) -> list[int]:
    hf_model.generation_config.eos_token_id = None  # run the full length, whatever comes out
    hf_model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([token_ids]), attention_mask=torch.ones(1, len(token_ids), dtype=torch.long),
                                max_new_tokens=num_new_tokens, do_sample=False)
    return out[0, len(token_ids):].tolist()


@dataclass
class PagedDriver:
    """Owns per-layer KV caches and per-request block lists; `step` runs one varlen forward."""

    model: LlamaForCausalLM
    arch: ArchConfig
    block_size: int = 4
    num_blocks: int = 64
    seed: int = 0
    kv_caches: list[torch.Tensor] = field(init=False)  # per layer [2, num_blocks, kv_heads, block_size, head_dim]
    free_blocks: list[int] = field(init=False)
    block_ids: dict[int, list[int]] = field(init=False, default_factory=dict)
    num_computed: dict[int, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        dtype = next(self.model.parameters()).dtype
        shape = (2, self.num_blocks, self.arch.num_key_value_heads, self.block_size, self.arch.head_dim)
        # Filled with large garbage (finite, so masked-out reads stay harmless): a read of a
        # never-written slot that is not masked out changes the logits far beyond tolerance.
        generator = torch.Generator().manual_seed(self.seed)
        self.kv_caches = [(50 * torch.randn(shape, generator=generator)).to(dtype)
                          for _ in range(self.arch.num_hidden_layers)]
        self.free_blocks = list(range(self.num_blocks))
        random.Random(self.seed).shuffle(self.free_blocks)

    def step(self, chunks: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """chunks: request id -> its next tokens. Returns request id -> [len(tokens), vocab] logits."""
        req_ids = list(chunks)
        query_lens, seq_lens, input_ids, positions = [], [], [], []
        for req in req_ids:
            start = self.num_computed.get(req, 0)
            end = start + len(chunks[req])
            blocks = self.block_ids.setdefault(req, [])
            while len(blocks) * self.block_size < end:
                blocks.append(self.free_blocks.pop())
            query_lens.append(len(chunks[req]))
            seq_lens.append(end)
            input_ids.extend(chunks[req])
            positions.extend(range(start, end))
            self.num_computed[req] = end
        meta = AttentionMetadata.build(query_lens=query_lens, seq_lens=seq_lens,
                                       block_ids=[self.block_ids[r] for r in req_ids],
                                       block_size=self.block_size, device="cpu")
        with torch.inference_mode():
            hidden = self.model(torch.tensor(input_ids, dtype=torch.int64),
                                torch.tensor(positions, dtype=torch.int64), self.kv_caches, meta)
            logits = self.model.compute_logits(hidden)
        out, offset = {}, 0
        for req, q_len in zip(req_ids, query_lens):
            out[req] = logits[offset: offset + q_len]
            offset += q_len
        return out

    def greedy(self, prompts: list[list[int]], num_new_tokens: int) -> list[list[int]]:
        """All prompts prefilled in one step, then one decode step per token for all at once."""
        last = self.step({i: p for i, p in enumerate(prompts)})
        outputs: list[list[int]] = [[] for _ in prompts]
        for _ in range(num_new_tokens):
            next_tokens = {i: int(last[i][-1].argmax()) for i in range(len(prompts))}
            for i, token in next_tokens.items():
                outputs[i].append(token)
            last = self.step({i: [t] for i, t in next_tokens.items()})
        return outputs


def random_prompts(lengths: list[int], vocab_size: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(n)] for n in lengths]
