"""Weights and KV caches in 2 MiB pages (engine/worker/huge_pages.py)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from engine.config import DeviceConfig
from engine.worker.huge_pages import (
    HUGE_PAGE_BYTES,
    collapse_into_huge_pages,
    collapse_supported,
    collapsible_bytes,
    huge_page_bytes,
    huge_pages_available,
    module_tensors,
    zeros_in_huge_pages,
)
from engine.worker.kv_cache import KVCacheSpec, allocate_kv_caches
from kernels.onednn_linear import onednn_available, onednn_linear, prepack

THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def _thp_allowed() -> bool:
    """Transparent huge pages not switched off for the machine ("[never]")."""
    if not os.path.exists(THP_SETTING):
        return False
    return "[never]" not in open(THP_SETTING).read()


needs_collapse = pytest.mark.skipif(not collapse_supported(),
                                    reason="MADV_COLLAPSE needs Linux 6.1+")
needs_thp = pytest.mark.skipif(not (huge_pages_available() and _thp_allowed()),
                               reason="transparent huge pages are off or not Linux")


@needs_collapse
def test_collapse_keeps_addresses_and_contents() -> None:
    weight = torch.randn(3 << 20)  # [3Mi] float32: 12 MiB, several whole huge pages
    expected = weight.clone()
    address = weight.data_ptr()
    collapsed = collapse_into_huge_pages([weight, weight[5:], weight.view(3, -1)])  # one storage, seen once
    assert weight.data_ptr() == address
    assert torch.equal(weight, expected)
    # Everything but at most a partial page at each end, unless another mapping shares those.
    assert 12 * 2**20 - 2 * HUGE_PAGE_BYTES <= collapsed <= 12 * 2**20
    assert huge_page_bytes(weight) >= collapsed - 2 * HUGE_PAGE_BYTES


@needs_collapse
@pytest.mark.skipif(not onednn_available(), reason="needs oneDNN")
def test_onednn_packed_weights_are_collapsed_in_place() -> None:
    """A oneDNN-packed weight is opaque to torch; its buffer (oneDNN's) is collapsed all the same,
    and the product over it is unchanged."""
    weights = [torch.randn(3072, 576) for _ in range(4)]  # 7 MiB each in float32
    packed = [prepack(w) for w in weights]
    x = torch.randn(3, 576)
    before = [onednn_linear(x, p) for p in packed]
    assert collapsible_bytes(packed) == 4 * 3072 * 576 * 4
    collapsed = collapse_into_huge_pages(packed)
    assert collapsed >= 4 * (3072 * 576 * 4 - 2 * HUGE_PAGE_BYTES)
    assert all(torch.equal(onednn_linear(x, p), b) for p, b in zip(packed, before))


def test_small_and_foreign_storages_are_left_alone() -> None:
    assert collapse_into_huge_pages([torch.randn(100), torch.empty(0)]) == 0
    assert collapse_into_huge_pages([torch.randn(1 << 20, device="meta")]) == 0
    assert collapse_into_huge_pages([]) == 0


@needs_thp
def test_zeros_in_huge_pages_faults_huge_pages_in() -> None:
    cache = zeros_in_huge_pages((4, 2, 1 << 20), torch.float32)  # 32 MiB
    assert cache.shape == (4, 2, 1 << 20) and cache.dtype == torch.float32
    assert not cache.any()
    assert huge_page_bytes(cache) >= 32 * 2**20 - 2 * HUGE_PAGE_BYTES


def test_kv_caches_in_huge_pages_match_the_plain_ones() -> None:
    spec = KVCacheSpec(num_layers=3, num_kv_heads=2, head_dim=64, block_size=16, dtype=torch.float32)
    plain = allocate_kv_caches(spec, 300, torch.device("cpu"))
    huge = allocate_kv_caches(spec, 300, torch.device("cpu"), huge_pages=True)
    assert [c.shape for c in huge] == [c.shape for c in plain]
    assert all(not c.any() for c in huge)
    # Views of one storage, as before: layer i is storage[i].
    assert huge[1].data_ptr() - huge[0].data_ptr() == huge[0].numel() * huge[0].element_size()


def test_module_tensors_finds_attributes_parameters_and_buffers() -> None:
    layer = nn.Linear(4, 4)
    layer.register_buffer("scale", torch.ones(4))
    layer.weight_bf16 = torch.zeros(4, 4, dtype=torch.bfloat16)  # an execution form kept as a plain attribute
    model = nn.Sequential(layer)
    found = {id(t) for t in module_tensors(model, None)}
    assert {id(layer.weight), id(layer.bias), id(layer.scale), id(layer.weight_bf16)} <= found


def test_device_config_checks_huge_pages() -> None:
    with pytest.raises(ValueError, match="huge_pages"):
        DeviceConfig(huge_pages="yes")  # type: ignore[arg-type]
