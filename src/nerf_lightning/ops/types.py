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
