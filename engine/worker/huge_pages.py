"""The CPU engine's weights and KV caches in 2 MiB pages (Linux transparent huge pages).

Why: a decode step on a CPU streams every weight once (540 MB for the embedded model in float32),
and with 4 KiB pages that is a page walk every 4 KiB and a hardware prefetcher that stops at every
page boundary. Linux backs anonymous memory with 2 MiB pages only where asked (the usual
`transparent_hugepage/enabled` setting is "madvise"), and torch never asks. Measured on an AMD
EPYC with AVX2 (2 threads, the embedded model in float32, two engines side by side with their
steps interleaved, `python -m engine.benchmarks.huge_pages`, docs/benchmarks.md): plain decoding
7% faster at one stream (1.07-1.08x a round), 1-2% at 8; hybrid speculation 4% at one stream.
(A 64-token decode timed call by call, engines taking turns per request, read 1.16x at one
stream and 1.05x at 8.) On an AMX Xeon (bf16, where oneDNN holds the linears packed, and those
buffers are collapsed too): plain decoding 1.06x at one stream and 1.05x at 8; in float32 there
1.04x at both, hybrid 1.02x and 1.01x.

How, without moving a tensor (so every pointer already handed to a compiled kernel stays valid):
- weights, after loading: MADV_COLLAPSE (Linux 6.1+) rebuilds the memory under each storage as
  huge pages in place, same addresses and contents (~3 ms per 2 MiB here: under a second for
  the embedded model), and MADV_HUGEPAGE keeps it eligible;
- KV caches, at allocation: MADV_HUGEPAGE on the untouched memory before it is zeroed, so the
  zeroing faults it in as huge pages directly.
The ranges are the 2 MiB pages that overlap a storage, so a weight's first and last partial pages
are collapsed with whatever shares them (its neighbours, usually other weights; contents never
change). Where the kernel cannot (another OS, an older kernel, THP disabled for the process)
nothing changes and the engine runs on 4 KiB pages as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
import sys
from collections.abc import Iterable

import torch
from torch import nn

HUGE_PAGE_BYTES = 2 << 20
MADV_HUGEPAGE = 14  # include/uapi/asm-generic/mman-common.h
MADV_COLLAPSE = 25  # Linux 6.1+
MIN_STORAGE_BYTES = 64 << 10  # smaller storages ride along in their neighbours' pages or not at all


@functools.cache
def _madvise() -> ctypes._CFuncPtr | None:
    """libc's madvise on Linux, else None."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c") or "libc.so.6"
    try:
        fn = ctypes.CDLL(name, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def huge_pages_available() -> bool:
    """Whether this process can ask for huge pages at all (Linux with madvise)."""
    return _madvise() is not None


def collapse_supported() -> bool:
    """Whether the kernel has MADV_COLLAPSE (Linux 6.1+), which the weights need."""
    if not huge_pages_available():
        return False
    try:
        major, minor = (int(x) for x in platform.release().split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (6, 1)


def _storage_range(tensor: torch.Tensor) -> tuple[int, int] | None:
    """[start, end) addresses of a CPU tensor's whole storage, or None (another device, other
    layouts, storages too small to matter). A oneDNN-packed weight (the linears' execution form
    where oneDNN computes them: AVX512 CPUs, float32 or bf16) is opaque to torch, but oneDNN
    reports its buffer; packed at load one after another, they lie side by side in the heap."""
    if tensor.device.type != "cpu":
        return None
    try:
        if tensor.is_mkldnn:
            start, nbytes = torch.ops.mkldnn.data_ptr(tensor), torch.ops.mkldnn._nbytes(tensor)
        elif tensor.layout != torch.strided:
            return None
        else:
            storage = tensor.untyped_storage()
            start, nbytes = storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None
    if start == 0 or nbytes < MIN_STORAGE_BYTES:
        return None
    return start, start + nbytes


def _storage_ranges(tensors: Iterable[torch.Tensor]) -> set[tuple[int, int]]:
    """The distinct storage ranges (_storage_range) under tensors: a storage seen through several
    views counts once."""
    return {r for r in map(_storage_range, tensors) if r is not None}


def collapsible_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of the storages under tensors that collapse_into_huge_pages asks to collapse:
    CPU storages (strided, or oneDNN-packed weights) of MIN_STORAGE_BYTES or more."""
    return sum(end - start for start, end in _storage_ranges(tensors))


def collapse_into_huge_pages(tensors: Iterable[torch.Tensor]) -> int:
    """Backs the CPU storages under tensors with 2 MiB pages in place (contents and addresses
    unchanged). Returns how many of those storages' bytes now lie in huge pages the kernel
    collapsed (0 where it cannot: see the module docstring)."""
    madvise = _madvise()
    if madvise is None:
        return 0
    # Each 2 MiB page that overlaps a storage -> the storages' bytes on it.
    overlap: dict[int, int] = {}
    for start, end in _storage_ranges(tensors):
        for page in range(start - start % HUGE_PAGE_BYTES, end, HUGE_PAGE_BYTES):
            overlap[page] = overlap.get(page, 0) + min(end, page + HUGE_PAGE_BYTES) - max(start, page)
    collapsed = 0
    for page in sorted(overlap):
        madvise(page, HUGE_PAGE_BYTES, MADV_HUGEPAGE)
        # Fails for one page (not all of it mapped, another mapping's flags, no free huge page
        # just now) or for all (no MADV_COLLAPSE before Linux 6.1): that page stays as it was.
        if madvise(page, HUGE_PAGE_BYTES, MADV_COLLAPSE) == 0:
            collapsed += overlap[page]
    return collapsed


def module_tensors(*modules: nn.Module | None) -> list[torch.Tensor]:
    """Every tensor the modules hold: parameters, buffers, and plain tensor attributes (the
    execution forms of linears keep their weights as such, e.g. a bf16 or prepacked copy)."""
    found: list[torch.Tensor] = []
    for module in modules:
        if module is None:
            continue
        for sub in module.modules():
            found.extend(t for t in sub._parameters.values() if t is not None)
            found.extend(t for t in sub._buffers.values() if t is not None)
            found.extend(v for v in vars(sub).values() if isinstance(v, torch.Tensor))
    return found


def zeros_in_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.zeros on the CPU, its memory asked into huge pages before anything touches it (a
    large torch.empty is a fresh, untouched mapping; zeroing it then faults huge pages in)."""
    tensor = torch.empty(shape, dtype=dtype)
    madvise = _madvise()
    if madvise is not None and tensor.numel() > 0:
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        first = start + (-start) % HUGE_PAGE_BYTES  # only whole huge pages of our own memory
        last = end - end % HUGE_PAGE_BYTES
        if last > first:
            madvise(first, last - first, MADV_HUGEPAGE)
    return tensor.zero_()


def huge_page_bytes(tensor: torch.Tensor) -> int:
    """How many bytes of the mappings holding tensor's storage lie in huge pages, summed over those
    mappings (/proc/self/smaps' AnonHugePages; 0 off Linux): for tests and diagnostics."""
    span = _storage_range(tensor)
    if span is None or not sys.platform.startswith("linux"):
        return 0
    start, end = span
    total, inside = 0, False
    with open("/proc/self/smaps", encoding="ascii", errors="replace") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):  # a mapping's header: "lo-hi perms ..."
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < end and start < hi
            elif inside and head == "AnonHugePages:":
                total += int(line.split()[1]) * 1024
    return total
