"""Every way a checkpoint can be wrong gives an error that names the culprit."""

from __future__ import annotations

import json
import os

import pytest
import torch
from gguf import GGMLQuantizationType
from safetensors.torch import load_file, save_file

from engine.model.loader import load_model
from engine.model.resolve import ResolvedModel
from gguf_harness import write_gguf
from model_harness import random_hf_model, tiny_hf_config

pytest.importorskip("transformers")


def _load(path, fmt: str = "hf", dtype: torch.dtype = torch.float32):
    return load_model(ResolvedModel(str(path), fmt, "tiny"), dtype, "cpu", progress=False)


@pytest.fixture
def checkpoint(tmp_path):
    random_hf_model(tiny_hf_config("qwen2_bias"), seed=0).save_pretrained(tmp_path)
    return tmp_path


@pytest.fixture
def sharded_checkpoint(tmp_path):
    random_hf_model(tiny_hf_config("qwen2_bias"), seed=0).save_pretrained(tmp_path, max_shard_size="40KB")
    return tmp_path


def _edit_config(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config))


def test_missing_config_json(checkpoint) -> None:
    os.remove(checkpoint / "config.json")
    with pytest.raises(FileNotFoundError, match="config.json"):
        _load(checkpoint)


def test_missing_weights_file(checkpoint) -> None:
    os.remove(checkpoint / "model.safetensors")
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        _load(checkpoint)


def test_missing_shard_is_named(sharded_checkpoint) -> None:
    index = json.loads((sharded_checkpoint / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    os.remove(sharded_checkpoint / shard)
    with pytest.raises(FileNotFoundError, match=shard):
        _load(sharded_checkpoint)


def test_unknown_architecture_lists_supported(checkpoint) -> None:
    _edit_config(checkpoint, architectures=["GPT2LMHeadModel"], model_type="gpt2")
    with pytest.raises(ValueError, match="GPT2LMHeadModel.*LlamaForCausalLM.*Qwen3ForCausalLM"):
        _load(checkpoint)


def test_shape_mismatch_names_tensor_and_both_shapes(checkpoint) -> None:
    _edit_config(checkpoint, intermediate_size=96)
    # Whichever MLP tensor the file holds first is reported, with the shape found and expected.
    pattern = r"model\.layers\.0\.mlp\.\w+_proj\.weight.*has shape \[(128, 64|64, 128)\], expected \[(96, 64|64, 96)\]"
    with pytest.raises(ValueError, match=pattern):
        _load(checkpoint)


def test_missing_tensor_is_named(checkpoint) -> None:
    path = checkpoint / "model.safetensors"
    tensors = load_file(path)
    del tensors["model.layers.1.self_attn.k_proj.bias"]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.layers\.1\.self_attn\.k_proj\.bias"):
        _load(checkpoint)


def test_unsupported_dtype(checkpoint) -> None:
    with pytest.raises(ValueError, match="dtype"):
        _load(checkpoint, dtype=torch.int8)


def test_missing_gguf_file(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="nothere.gguf"):
        _load(tmp_path / "nothere.gguf", "gguf")


def test_not_a_gguf_file(tmp_path) -> None:
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(ValueError, match="junk.gguf"):
        _load(path, "gguf")


def test_gguf_shape_mismatch_names_tensor(tmp_path) -> None:
    path = tmp_path / "bad.gguf"
    write_gguf(path, random_hf_model(tiny_hf_config("llama_tied"), seed=0), "llama", GGMLQuantizationType.F32,
               feed_forward_length=96)
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_\w+\.weight.*bad\.gguf.*expected"):
        _load(path, "gguf")


def test_gguf_unknown_architecture(tmp_path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "phi.gguf"
    writer = GGUFWriter(str(path), "phi2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match="phi2.*llama"):
        _load(path, "gguf")


def test_gguf_missing_tensor_uses_gguf_name(tmp_path) -> None:
    hf_model = random_hf_model(tiny_hf_config("llama_tied"), seed=0)
    state = hf_model.state_dict()
    del state["model.layers.1.mlp.up_proj.weight"]

    class Partial:
        config = hf_model.config

        @staticmethod
        def state_dict():
            return state

    path = tmp_path / "partial.gguf"
    write_gguf(path, Partial, "llama", GGMLQuantizationType.F32)
    with pytest.raises(ValueError, match=r"blk\.1\.ffn_up\.weight"):
        _load(path, "gguf")
