"""Engine configuration: one frozen dataclass per subsystem.

Each component receives only its own part. Validation raises ValueError naming the field.
Environment variables are read here and nowhere else (see `from_env`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

DTYPES = ("auto", "float32", "bfloat16", "float16")  # model and draft dtypes
QUANTIZATION_METHODS = ("int8", "int4", "fp8", "gptq", "awq")
KV_CACHE_DTYPES = ("auto", "fp8")
DRAFT_WEIGHT_FORMATS = ("auto", "dtype", "bf16", "int8")  # how a float32 draft holds its weights


def _require(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{name} {message}")


@dataclass(frozen=True)
class ModelConfig:
    """Which weights to run and how.

    model: None for the embedded default (SmolLM2-135M-Instruct GGUF), else a GGUF file or a
    Hugging Face checkpoint folder. dtype "auto" means bfloat16 on CUDA and on CPUs with native
    bf16 (AMX or AVX512-BF16), float32 on other CPUs.
    max_model_len: None takes the model's own context length.
    """

    model: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    seed: int = 0
    # Weight quantization: int8 / int4 / fp8 quantize at load; gptq / awq name a quantized
    # checkpoint (detected from its config.json anyway). See engine/model/quantization.py.
    quantization: str | None = None

    def __post_init__(self) -> None:
        _require(self.dtype in DTYPES, "dtype", f"must be one of {DTYPES}, got {self.dtype!r}")
        _require(self.quantization is None or self.quantization in QUANTIZATION_METHODS, "quantization",
                 f"must be one of {QUANTIZATION_METHODS} or None, got {self.quantization!r}")
        _require(self.max_model_len is None or self.max_model_len >= 1, "max_model_len",
                 f"must be >= 1, got {self.max_model_len}")


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache.

    kv_cache_memory_bytes: the KV budget on CPU (and on CUDA when set). On CUDA without it,
    gpu_memory_utilization is the fraction of total device memory the whole engine may use;
    KV gets what is left after weights and a measured activation peak.
    num_gpu_blocks_override: exact number of blocks (tests use tiny pools).
    """

    block_size: int = 16
    kv_cache_memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9
    num_blocks_override: int | None = None
    enable_prefix_caching: bool = True
    # "auto": the model dtype; "fp8": float8 e4m3 with a scale per stored vector (half the
    # bytes of bf16; kernels/kv_store.py).
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        _require(self.kv_cache_dtype in KV_CACHE_DTYPES, "kv_cache_dtype",
                 f"must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        _require(self.block_size >= 1 and self.block_size & (self.block_size - 1) == 0, "block_size",
                 f"must be a power of two, got {self.block_size}")
        _require(self.kv_cache_memory_bytes is None or self.kv_cache_memory_bytes > 0, "kv_cache_memory_bytes",
                 f"must be > 0, got {self.kv_cache_memory_bytes}")
        _require(0.0 < self.gpu_memory_utilization <= 1.0, "gpu_memory_utilization",
                 f"must be in (0, 1], got {self.gpu_memory_utilization}")
        _require(self.num_blocks_override is None or self.num_blocks_override >= 1, "num_blocks_override",
                 f"must be >= 1, got {self.num_blocks_override}")


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching.

    max_num_batched_tokens: the per-step token budget shared by all requests.
    long_prefill_token_threshold: a prompt chunk larger than this is cut so decodes keep flowing
    (0: no cap beyond the budget).
    policy: "fcfs" (arrival order) or "priority" (lower priority value first, then arrival).
    """

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 1024
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    policy: str = "priority"

    def __post_init__(self) -> None:
        _require(self.max_num_seqs >= 1, "max_num_seqs", f"must be >= 1, got {self.max_num_seqs}")
        _require(self.max_num_batched_tokens >= 1, "max_num_batched_tokens",
                 f"must be >= 1, got {self.max_num_batched_tokens}")
        _require(self.long_prefill_token_threshold >= 0, "long_prefill_token_threshold",
                 f"must be >= 0, got {self.long_prefill_token_threshold}")
        _require(self.policy in ("fcfs", "priority"), "policy", f"must be 'fcfs' or 'priority', got {self.policy!r}")


@dataclass(frozen=True)
class DeviceConfig:
    """device "auto" picks cuda when available, else cpu. num_threads: CPU threads for torch
    (None: leave torch's default). huge_pages: on a CPU, back the weights and KV caches with 2 MiB
    pages where Linux allows it (engine/worker/huge_pages.py; one-stream decoding 7% faster on an
    AVX2 EPYC); False keeps whatever pages the allocator gave."""

    device: str = "auto"
    num_threads: int | None = None
    huge_pages: bool = True

    def __post_init__(self) -> None:
        _require(self.device == "auto" or self.device.split(":")[0] in ("cpu", "cuda"), "device",
                 f"must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")
        _require(self.num_threads is None or self.num_threads >= 1, "num_threads",
                 f"must be >= 1, got {self.num_threads}")
        _require(isinstance(self.huge_pages, bool), "huge_pages", f"must be a bool, got {self.huge_pages!r}")


SPECULATIVE_METHODS = ("none", "draft", "suffix", "hybrid")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding.

    method: "none", "draft" (a small draft model), "suffix" (model-free: continuations of the
    request's own context and of recent outputs) or "hybrid" (per request and step, whichever
    expects more accepted tokens).
    draft_model: a draft folder or GGUF file for "draft"/"hybrid"; None takes the draft shipped
    for the embedded model (only when the target is the embedded model).
    num_speculative_tokens: the most tokens a draft model drafts per request per step.
    num_suffix_tokens: the most tokens suffix matching drafts per request per step ("suffix" and
    "hybrid"). Its own cap, longer: suffix drafts cost no model compute, and where text repeats
    (tool calls, JSON, quoted code) a match runs long; a draft model pays for every position.
    adaptive: draft fewer tokens when a request's acceptance is low or the batch is large.
    draft_dtype: the draft's weights, activations and KV: "auto" (on a CPU with AVX2 or wider
    where the compiled kernels built: float32 over held weights, see draft_weights, whatever the
    target's dtype; elsewhere the target's dtype, except under a float32 target where
    `dtype="auto"` would take bfloat16: there the draft runs in bfloat16) or a dtype
    ("float32": all of it in float32).
    suffix_corpus: a fixed corpus of the target's past outputs that suffix matching ("suffix",
    "hybrid") also follows (a .npy of token ids, documents ended by -1: `python -m drafts
    suffix-corpus`; engine/spec_decode/corpus.py): None takes the one shipped for the embedded
    model (only when the target is the embedded model), "none" none.
    draft_weights: how a float32 draft on a CPU whose few-row products take the compiled kernel
    (AVX2 or wider) holds its weights, computing in float32 over them: "bf16" (half the bytes, exact for
    the shipped drafts' bf16 layers), "int8" (a quarter, one scale per row: rounds them), "dtype"
    (float32 itself), or "auto": int8 under draft_dtype "auto", else the dtype
    (engine/worker/model_runner.py's draft_weight_format).
    Drafts only propose and the target verifies every token, so the draft's precision changes
    how many tokens are accepted, never the output.
    """

    method: str = "none"
    draft_model: str | None = None
    num_speculative_tokens: int = 4
    num_suffix_tokens: int = 16
    adaptive: bool = True
    draft_dtype: str = "auto"
    draft_weights: str = "auto"
    suffix_corpus: str | None = None

    def __post_init__(self) -> None:
        _require(self.draft_weights in DRAFT_WEIGHT_FORMATS, "draft_weights",
                 f"must be one of {DRAFT_WEIGHT_FORMATS}, got {self.draft_weights!r}")
        _require(self.draft_dtype in DTYPES, "draft_dtype",
                 f"must be one of {DTYPES}, got {self.draft_dtype!r}")
        _require(self.method in SPECULATIVE_METHODS, "speculative",
                 f"must be one of {SPECULATIVE_METHODS}, got {self.method!r}")
        _require(1 <= self.num_speculative_tokens <= 16, "num_speculative_tokens",
                 f"must be in [1, 16], got {self.num_speculative_tokens}")
        _require(1 <= self.num_suffix_tokens <= 32, "num_suffix_tokens",
                 f"must be in [1, 32], got {self.num_suffix_tokens}")
        _require(self.draft_model is None or self.method in ("draft", "hybrid"), "draft",
                 f"a draft model needs speculative 'draft' or 'hybrid', got {self.method!r}")

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    @property
    def uses_draft_model(self) -> bool:
        return self.method in ("draft", "hybrid")


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)


def default_kv_cache_memory_bytes_from_env() -> int | None:
    """DRAFTGATE_KV_CACHE_MEMORY: the CPU KV budget, e.g. "2GiB" or a byte count."""
    raw = os.environ.get("DRAFTGATE_KV_CACHE_MEMORY")
    return parse_bytes(raw) if raw else None


def parse_bytes(text: str) -> int:
    """"2GiB", "512MiB", "1.5GB", "1000000" -> bytes."""
    units = {"kib": 2**10, "mib": 2**20, "gib": 2**30, "kb": 10**3, "mb": 10**6, "gb": 10**9, "b": 1}
    lowered = text.strip().lower()
    for suffix, scale in units.items():
        if lowered.endswith(suffix):
            number = lowered[: -len(suffix)].strip()
            try:
                return int(float(number) * scale)
            except ValueError:
                break
    try:
        return int(lowered)
    except ValueError:
        raise ValueError(f"kv_cache_memory must be a size like '2GiB' or a byte count, got {text!r}") from None


def build_engine_config(
    model: str | None = None,
    *,
    dtype: str = "auto",
    device: str = "auto",
    max_model_len: int | None = None,
    block_size: int = 16,
    kv_cache_memory: int | str | None = None,
    gpu_memory_utilization: float = 0.9,
    num_blocks: int | None = None,
    enable_prefix_caching: bool = True,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 1024,
    enable_chunked_prefill: bool = True,
    long_prefill_token_threshold: int = 0,
    scheduling_policy: str = "priority",
    seed: int = 0,
    num_threads: int | None = None,
    huge_pages: bool = True,
    quantization: str | None = None,
    kv_cache_dtype: str = "auto",
    speculative: str = "none",
    draft: str | None = None,
    num_speculative_tokens: int = 4,
    num_suffix_tokens: int = 16,
    adaptive_speculation: bool = True,
    draft_dtype: str = "auto",
    draft_weights: str = "auto",
    suffix_corpus: str | None = None,
) -> EngineConfig:
    """One place that turns keyword options (offline API and CLI alike) into EngineConfig."""
    if isinstance(kv_cache_memory, str):
        kv_cache_memory = parse_bytes(kv_cache_memory)
    if kv_cache_memory is None:
        kv_cache_memory = default_kv_cache_memory_bytes_from_env()
    return EngineConfig(
        model=ModelConfig(model=model, dtype=dtype, max_model_len=max_model_len, seed=seed,
                          quantization=quantization),
        cache=CacheConfig(
            block_size=block_size,
            kv_cache_memory_bytes=kv_cache_memory,
            gpu_memory_utilization=gpu_memory_utilization,
            num_blocks_override=num_blocks,
            enable_prefix_caching=enable_prefix_caching,
            kv_cache_dtype=kv_cache_dtype,
        ),
        scheduler=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold,
            policy=scheduling_policy,
        ),
        device=DeviceConfig(device=device, num_threads=num_threads, huge_pages=huge_pages),
        speculative=SpeculativeConfig(method=speculative, draft_model=draft,
                                      num_speculative_tokens=num_speculative_tokens,
                                      num_suffix_tokens=num_suffix_tokens, adaptive=adaptive_speculation,
                                      draft_dtype=draft_dtype, draft_weights=draft_weights,
                                      suffix_corpus=suffix_corpus),
    )
