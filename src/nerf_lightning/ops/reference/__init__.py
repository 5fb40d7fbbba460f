"""Reference ops in pure PyTorch: the contract of every backend and the oracle the CUDA kernels equal.

Every function here is pure, works on any device, and is vectorized (no Python loop over rays or
samples; ``march_rays`` loops over *chunks* of rays only to bound memory). The docstrings are the
contract of every backend; where a float32 detail matters, the exact sequence of operations is
written down so that a kernel can reproduce it. One module per concept:

- ``rays``: ray/box intersection, sample positions, box normalization;
- ``grid``: occupancy-grid cells, cascades, the density EMA, occupancy bits;
- ``marching``: marching into packed samples, repacking into fixed buffers;
- ``compositing``: volume-rendering weights and per-ray sums;
- ``losses``: the photometric loss of a batch, the distortion loss;
- ``step``: the fixed-budget step's ray count;
- ``mlp``: the fused half-precision MLP and the density activation;
- ``encoding``: the hash-grid and spherical-harmonics encodings.

The public functions of these modules (their ``__all__``) are the ops: ``nerf_lightning.ops.OP_NAMES``
is derived from this package's ``__all__``, and every backend provides each of them.

Two layouts of packed samples (``types.PackedSamples``):

- *dynamic*: ``S`` is the number of samples (``march_rays``; one host sync sizes the outputs);
- *fixed* (``march_rays_fixed``, ``repack``): ``S`` is a capacity chosen by the caller, so shapes
  never depend on data (no host sync; CUDA-graph capturable). Samples ``[0, n)`` belong to the rays
  as ``packed_info`` says; ``[n, S)`` are padding with ray index 0 and ``t_start = t_end = 0``: a
  zero-length interval has weight 0 and no gradient, so every compositing op may read them. Rays
  that did not fit are flagged in a ``ray_valid`` mask and have no samples.

Scene space is instant-ngp's NGP space: the object in the unit cube [0, 1]^3, the outer box
``[0.5 - aabb_scale/2, 0.5 + aabb_scale/2]^3``, occupancy cascade ``c`` covering
``[0.5 - 2^c/2, 0.5 + 2^c/2]^3`` with ``G^3`` cells, flat cell index ``(ix * G + iy) * G + iz``.
"""

from __future__ import annotations

from ..types import PackedSamples
from . import compositing, encoding, grid, losses, marching, mlp, rays, step
from .compositing import *  # noqa: F403
from .encoding import *  # noqa: F403
from .grid import *  # noqa: F403
from .losses import *  # noqa: F403
from .marching import *  # noqa: F403
from .mlp import *  # noqa: F403
from .rays import *  # noqa: F403
from .step import *  # noqa: F403

#: the concept modules, in the order of the contract
MODULES = (rays, grid, marching, compositing, losses, step, mlp, encoding)

__all__ = ["PackedSamples", *(name for module in MODULES for name in module.__all__)]
