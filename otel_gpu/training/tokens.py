"""Tokens of a training batch, counted on the host from the batch a DataLoader returns.

A batch is what the loader's `__next__` gives back, before the program moves it to a GPU:
a mapping (a dict, a tokenizer's `BatchEncoding`) with `input_ids` and, where padding was
added, `attention_mask`; a tuple or list whose first item is such a mapping or a token-id
tensor; or a token-id tensor alone (integer dtype, 2-D: batch x sequence).

Tokens are the non-padding ones: the sum of a 0/1 (or bool) attention mask, as tokenizers
and collators make it; without a mask, every id of `input_ids` (its shape only). A mask that
is not on the CPU is never read (reading it would wait for the GPU): that batch is not
counted. Nothing here synchronises with a device or changes the batch.

Cost (bench/bench_tokens.py): the mask is summed by numpy (count_nonzero for small masks, add.reduce
for large ones) over a view of the tensor's own memory (no copy, no torch dispatch); a plain dict or a `BatchEncoding` (a UserDict: its dict is
read directly) skips the Mapping ABC check.
"""
from __future__ import annotations

import functools
from collections import UserDict
from collections.abc import Mapping
from typing import Any

import numpy as np

MASK = "attention_mask"
IDS = "input_ids"
_sum = np.add.reduce   # the ufunc itself: ndarray.sum's Python wrapper costs ~1 us a call
SMALL = 4096           # elements: below, count_nonzero's smaller fixed cost wins (0.64 vs 1.18 us at 2048)


def _mask_sum(mask) -> int:
    """Sum of a 0/1 host mask (= its non-zero count), the cheaper numpy way for its size."""
    a = mask.numpy()
    return int(np.count_nonzero(a)) if a.size <= SMALL else int(_sum(a, axis=None))


def _is_int_tensor(x: Any, dims: int = 2) -> bool:
    dtype = getattr(x, "dtype", None)
    shape = getattr(x, "shape", None)
    if dtype is None or shape is None or len(shape) != dims:
        return False
    return not (dtype.is_floating_point or dtype.is_complex)


def _parts(batch: Any) -> tuple[Any, Any]:
    """(input ids, attention mask) of a batch, each None when absent."""
    if type(batch) is dict or isinstance(batch, Mapping):
        ids, mask = batch.get(IDS), batch.get(MASK)
        return (ids if _is_int_tensor(ids) else None), mask
    if isinstance(batch, (tuple, list)) and batch:
        first = batch[0]
        if isinstance(first, Mapping):
            return _parts(first)
        return (first if _is_int_tensor(first) else None), None
    return (batch if _is_int_tensor(batch) else None), None


def _fast_mask(batch: dict) -> Any:
    """The default collate's dict with a 2-D integer or bool host mask: that mask, else None (the
    general path decides). A few attribute reads, no ABC check, no dtype object walk."""
    mask = batch.get(MASK)
    if mask is None or getattr(mask, "ndim", 0) != 2 or not getattr(mask, "is_cpu", False):
        return None
    return mask if mask.dtype in _countable() else None


@functools.cache
def _countable() -> frozenset:
    """Integer and bool torch dtypes (torch is loaded: the batch came from its DataLoader)."""
    import torch

    return frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


def batch_tokens(batch: Any) -> tuple[int, int] | None:
    """(non-padding tokens, sequence length) of one batch, or None when it holds no tokens that can be
    counted without a device read (no token ids, a mask on a GPU, a mask that is not 2-D 0/1)."""
    if type(batch) is dict or isinstance(batch, UserDict):   # UserDict: a tokenizer's BatchEncoding
        mask = _fast_mask(batch if type(batch) is dict else batch.data)
        if mask is not None:
            return _mask_sum(mask), mask.shape[1]
    ids, mask = _parts(batch)
    if mask is not None:
        if not _is_int_tensor(mask) or not getattr(mask, "is_cpu", False):
            return None
        return _mask_sum(mask), int(mask.shape[-1])
    if ids is None:
        return None
    return int(ids.numel()), int(ids.shape[-1])
