"""GPTQ and AWQ int4 checkpoints, written here in their published packed layouts from a tiny
random model whose weights sit exactly on an int4 grid: the conversion recovers those weights
exactly, the loaded model's logits track transformers' on the same weights, and unsupported
variants fail with the field named."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from engine.model.layers.quant_linear import Int4Linear
from engine.model.loader import load_model
from engine.model.loader.gptq_awq import AWQ_ORDER, awq_to_int4, gptq_to_int4
from engine.model.resolve import ResolvedModel
from kernels.quant_ref import dequantize_int4
from model_harness import hf_logits, random_hf_model, random_prompts, tiny_hf_config

pytest.importorskip("transformers")

GROUP_SIZE = 32
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _to_int32(words: torch.Tensor) -> torch.Tensor:  # int64 holding 32-bit patterns -> int32
    words = words & 0xFFFFFFFF
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_rows(values: torch.Tensor) -> torch.Tensor:  # [R, C] 0..15 -> [R // 8, C]: 8 rows per word
    v = values.to(torch.int64).reshape(values.shape[0] // 8, 8, values.shape[1])
    return _to_int32(sum(v[:, j] << (4 * j) for j in range(8)))


def pack_cols(values: torch.Tensor, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """[R, C] 0..15 -> [R, C // 8]: value j of word c is column 8c + order[j]."""
    v = values.to(torch.int64).reshape(values.shape[0], values.shape[1] // 8, 8)
    return _to_int32(sum(v[:, :, order[j]] << (4 * j) for j in range(8)))


def _grid_weights(n: int, k: int, generator: torch.Generator, symmetric: bool):
    q = torch.randint(0, 16, (n, k), generator=generator)
    groups = k // GROUP_SIZE
    zeros = torch.full((groups, n), 8) if symmetric else torch.randint(1, 16, (groups, n), generator=generator)
    scales = (0.02 + 0.03 * torch.rand(groups, n, generator=generator)).half()
    weight = (q - zeros.t().repeat_interleave(GROUP_SIZE, dim=1)) * scales.float().t().repeat_interleave(GROUP_SIZE, dim=1)
    return q, zeros, scales, weight  # weight: [n, k] float32, exactly (q - z) * s


def write_checkpoint(folder, method: str, *, desc_act: bool = False):
    """A tiny Qwen2 (q/k/v biases, untied head) saved as a GPTQ or AWQ checkpoint; returns the
    transformers model holding exactly the weights the packed tensors encode."""
    hf = random_hf_model(tiny_hf_config("qwen2_bias"), seed=0)
    generator = torch.Generator().manual_seed(1)
    tensors: dict[str, torch.Tensor] = {}
    params = dict(hf.named_parameters())
    with torch.no_grad():
        for layer in range(hf.config.num_hidden_layers):
            for linear in LINEARS:
                name = f"model.layers.{layer}.{linear}"
                n, k = params[f"{name}.weight"].shape
                q, zeros, scales, weight = _grid_weights(n, k, generator, symmetric=method == "gptq")
                params[f"{name}.weight"].copy_(weight)
                if method == "gptq":
                    tensors[f"{name}.qweight"] = pack_rows(q.t())  # [K // 8, N]
                    tensors[f"{name}.qzeros"] = pack_cols(zeros - 1)  # AutoGPTQ stores zero - 1
                    g_idx = torch.arange(k, dtype=torch.int32) // GROUP_SIZE
                    if desc_act:
                        g_idx = g_idx[torch.randperm(k, generator=generator)]
                    tensors[f"{name}.g_idx"] = g_idx
                else:
                    tensors[f"{name}.qweight"] = pack_cols(q.t(), AWQ_ORDER)  # [K, N // 8]
                    tensors[f"{name}.qzeros"] = pack_cols(zeros, AWQ_ORDER)
                tensors[f"{name}.scales"] = scales
    for name, tensor in hf.state_dict().items():
        if not any(name.endswith(f"{linear}.weight") for linear in LINEARS):
            tensors[name] = tensor.half() if "bias" in name else tensor.clone()
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(folder / "model.safetensors"))
    config = hf.config.to_dict()
    if method == "gptq":
        config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": GROUP_SIZE,
                                         "desc_act": desc_act, "sym": True, "checkpoint_format": "gptq"}
    else:
        config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": GROUP_SIZE,
                                         "zero_point": True, "version": "gemm"}
    (folder / "config.json").write_text(json.dumps(config))
    # transformers reads the biases back from fp16, like our loader does.
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "bias" in name:
                param.copy_(param.half().float())
    return hf


def test_gptq_unpacking_recovers_the_weights_exactly() -> None:
    generator = torch.Generator().manual_seed(0)
    q, zeros, scales, weight = _grid_weights(16, 64, generator, symmetric=False)
    qweight, s, z = gptq_to_int4(pack_rows(q.t()), pack_cols(zeros - 1), scales,
                                 torch.arange(64) // GROUP_SIZE, GROUP_SIZE, zero_offset=1, name="w")
    torch.testing.assert_close(dequantize_int4(qweight, s, z, GROUP_SIZE), weight, atol=1e-6, rtol=0)


def test_awq_unpacking_recovers_the_weights_exactly() -> None:
    generator = torch.Generator().manual_seed(0)
    q, zeros, scales, weight = _grid_weights(16, 64, generator, symmetric=False)
    qweight, s, z = awq_to_int4(pack_cols(q.t(), AWQ_ORDER), pack_cols(zeros, AWQ_ORDER), scales)
    torch.testing.assert_close(dequantize_int4(qweight, s, z, GROUP_SIZE), weight, atol=1e-6, rtol=0)


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_quantized_checkpoint_loads_and_tracks_transformers(tmp_path, method: str) -> None:
    hf = write_checkpoint(tmp_path, method)
    model, arch = load_model(ResolvedModel(str(tmp_path), "hf", "tiny"), torch.float32, "cpu", progress=False)
    assert isinstance(model.layers[0].self_attn.qkv_proj, Int4Linear)
    assert model.layers[0].self_attn.qkv_proj.bias is not None
    from model_harness import PagedDriver

    prompt = random_prompts([10], arch.vocab_size, seed=4)[0]
    ours = PagedDriver(model, arch).step({0: prompt})[0]
    reference = hf_logits(hf, prompt)
    # Same weights; the CPU int4 kernel computes in bf16, so close rather than equal.
    assert (ours - reference).abs().mean() < 0.03 * reference.std()
    assert (ours.argmax(-1) == reference.argmax(-1)).float().mean() >= 0.9


def test_act_order_gptq_is_refused(tmp_path) -> None:
    write_checkpoint(tmp_path, "gptq", desc_act=True)
    with pytest.raises(ValueError, match="act-order"):
        load_model(ResolvedModel(str(tmp_path), "hf", "tiny"), torch.float32, "cpu", progress=False)


def test_quantization_option_must_match_the_checkpoint(tmp_path) -> None:
    write_checkpoint(tmp_path, "awq")
    resolved = ResolvedModel(str(tmp_path), "hf", "tiny")
    with pytest.raises(ValueError, match="already quantized"):
        load_model(resolved, torch.float32, "cpu", progress=False, quantization="int8")
    load_model(resolved, torch.float32, "cpu", progress=False, quantization="awq")  # naming it is fine


def test_unsupported_quant_method_is_named(tmp_path) -> None:
    write_checkpoint(tmp_path, "awq")
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["quant_method"] = "bitsandbytes"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quant_method"):
        load_model(ResolvedModel(str(tmp_path), "hf", "tiny"), torch.float32, "cpu", progress=False)
