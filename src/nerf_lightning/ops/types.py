"""Records shared by every ops backend (reference PyTorch and CUDA)."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor


class PackedSamples(NamedTuple):
    """Samples along rays in the packed (nerfacc) layout.

    Samples of one ray are contiguous and ordered by ``t``; ``S`` is the total number of samples.

    Attributes:
        ray_indices: int64 [S], the ray each sample belongs to (non-decreasing).
        t_starts: float32 [S], start of each sample's interval along its ray.
        t_ends: float32 [S], end of each sample's interval (``t_ends > t_starts``).
        packed_info: int64 [R, 2], per ray (index of its first sample, number of samples); rays
            without samples have count 0 (and first index = the number of samples before them).
    """

    ray_indices: Tensor
    t_starts: Tensor
    t_ends: Tensor
    packed_info: Tensor


def check_sample_arrays(where: str, **arrays: Tensor) -> int:
    """``S``, after checking that every array of packed samples is one-dimensional of that length.

    Raises ``ValueError`` naming the op ``where``, the arrays and their shapes otherwise.
    """
    shapes = [tuple(a.shape) for a in arrays.values()]
    n = shapes[0][0] if shapes and len(shapes[0]) == 1 else -1
    if n < 0 or any(s != (n,) for s in shapes):
        got = ", ".join(str(s) for s in shapes)
        raise ValueError(f"{where}: {', '.join(arrays)} must all be [S], got {got}")
    return n
