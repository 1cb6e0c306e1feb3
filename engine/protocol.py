"""Messages between the engine's front (gateway, AsyncEngine) and the engine core process.

msgspec Structs, msgpack-encoded, framed with a 4-byte big-endian length over a local stream
socket. Torch-free; imports nothing of ours but the leaf engine.sampling_params, so the gateway
can use it without loading the engine. Tagged unions are dispatched with `match`.
"""

from __future__ import annotations

import struct
from typing import Union

import msgspec

from engine.sampling_params import SamplingParams

# ---- front -> core -------------------------------------------------------------------------


class RetentionSpec(msgspec.Struct):
    """Keep a finished agent turn's KV blocks pinned while its tool runs (engine/core/session_retention.py).

    Applies when the request stops on its own ("stop"), and, with require_text, only when its
    output contains that text (the model's tool-call tag: the turn ended in a tool call).
    """

    ttl_seconds: float
    max_retained_fraction: float = 0.25  # cap on all retained blocks, as a fraction of the pool
    require_text: str | None = None


class StructuredOutputSpec(msgspec.Struct):
    """Constrained decoding: every sampled token must keep the output inside `grammar`, an
    llguidance grammar as built by engine.structured_output.grammars."""

    grammar: str


class AddRequest(msgspec.Struct, tag="add"):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    priority: int = 0  # lower value = more urgent
    cache_salt: str | None = None
    session_id: str | None = None  # the agent session (retention and next-turn priority)
    retention: RetentionSpec | None = None
    structured_output: StructuredOutputSpec | None = None


class AbortRequests(msgspec.Struct, tag="abort"):
    request_ids: list[str]


class GetStats(msgspec.Struct, tag="get_stats"):
    call_id: int


class ResetPrefixCache(msgspec.Struct, tag="reset_prefix_cache"):
    call_id: int


class Shutdown(msgspec.Struct, tag="shutdown"):
    pass


EngineInput = Union[AddRequest, AbortRequests, GetStats, ResetPrefixCache, Shutdown]

# ---- core -> front -------------------------------------------------------------------------


class TokenLogprobs(msgspec.Struct, array_like=True):
    """Log-probability of one generated token and the most likely alternatives at its position."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token_id, logprob), most likely first


class RequestDelta(msgspec.Struct, omit_defaults=True):
    """What one request produced in one step. The last delta of a request has finish_reason set
    ("stop", "length", "abort" or "error")."""

    request_id: str
    new_token_ids: list[int] = msgspec.field(default_factory=list)
    text: str = ""  # detokenized text delta, stop strings already applied
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    logprobs: list[TokenLogprobs] | None = None
    error: str | None = None  # set with finish_reason "error": why the engine refused it


class EngineStats(msgspec.Struct):
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of KV blocks in use
    num_blocks: int
    prefix_cache_queries: int  # prompt tokens looked up (cumulative)
    prefix_cache_hits: int  # of which found in the cache (cumulative)
    num_preemptions: int
    num_steps: int
    num_prompt_tokens: int  # prompt tokens computed (cumulative, prefix hits excluded)
    num_generation_tokens: int  # tokens generated (cumulative)
    last_step_seconds: float
    mean_step_seconds: float
    num_retained_sessions: int = 0  # agent sessions whose blocks are pinned while their tool runs
    num_retained_blocks: int = 0  # distinct blocks those pins hold
    # Speculative decoding (cumulative): verifications of a non-empty draft, drafted and accepted
    # tokens, and per draft position i how many drafts reached it and how many were accepted.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = msgspec.field(default_factory=list)
    spec_drafted_per_pos: list[int] = msgspec.field(default_factory=list)
    spec_proposer_seconds: float = 0.0  # time spent proposing (draft model or suffix)
    # First drafts the target rejected for one of the draft's runners-up (each also counted as
    # an accepted token at position 0, and bringing a bonus token; engine/worker/alternatives.py).
    spec_num_accepted_alternatives: int = 0
    runner_seconds: float = 0.0  # time in the model runner, proposing included


class EngineReady(msgspec.Struct, tag="ready"):
    model_name: str
    max_model_len: int
    vocab_size: int
    block_size: int
    num_blocks: int
    device: str
    dtype: str
    # Seed of the prefix-cache key chain (engine/core/block_hash.py): the gateway hashes its
    # canonical token streams with it, so its session and prefix keys are the engine's keys.
    block_hash_seed: str = ""


class EngineOutputs(msgspec.Struct, tag="outputs"):
    deltas: list[RequestDelta]


class StatsReply(msgspec.Struct, tag="stats"):
    call_id: int
    stats: EngineStats


class CallDone(msgspec.Struct, tag="done"):
    call_id: int


class EngineFailed(msgspec.Struct, tag="failed"):
    """The engine process cannot go on (e.g. failed to load the model); it exits after this."""

    message: str


EngineMessage = Union[EngineReady, EngineOutputs, StatsReply, CallDone, EngineFailed]

# ---- framing -------------------------------------------------------------------------------

FRAME_HEADER = struct.Struct(">I")
MAX_FRAME_BYTES = 1 << 30

_encoder = msgspec.msgpack.Encoder()
input_decoder = msgspec.msgpack.Decoder(EngineInput)
message_decoder = msgspec.msgpack.Decoder(EngineMessage)


def encode_frame(message: msgspec.Struct) -> bytes:
    payload = _encoder.encode(message)
    return FRAME_HEADER.pack(len(payload)) + payload
