"""CUDA backend of the ops: our extension (``ops/csrc``, built on first use by ``ops/_ext.py``).

Every op of ``nerf_lightning.ops.OP_NAMES`` is here, with the reference's name, signature, shapes and
dtypes (the contract: ``ops/reference``): a wrapper of our kernels (one module per concept, as the
reference), or the reference function itself where a kernel would not pay (``REFERENCE_OPS``).

A wrapper runs its kernel on the input it was written for (CUDA tensors, the dtypes its docstring
names, the extension loaded). Other input runs the reference after ONE ``RuntimeWarning`` per op and
reason (``_support.reference_for``), so a slow path never goes unnoticed; shapes the contract rules
out raise ``ValueError`` as the reference does. Differences from the reference are within float
rounding and are written down in each module's docstring.

Autograd functions use ``torch.amp.custom_fwd/custom_bwd(device_type="cuda")``: under autocast
(16-mixed, bf16-mixed) compositing inputs are cast to float32; the hash encoding keeps fp16/fp32
tables as they are and returns float32.
"""

from __future__ import annotations

from .. import reference as _reference
from ..reference.rays import MISS_T, SQRT3
from ..types import PackedSamples
from . import compositing, data, encoding, grid, losses, marching, mlp, rays, step
from ._support import is_available
from .compositing import *  # noqa: F403
from .data import *  # noqa: F403
from .encoding import *  # noqa: F403
from .grid import *  # noqa: F403
from .losses import *  # noqa: F403
from .marching import *  # noqa: F403
from .mlp import *  # noqa: F403
from .rays import *  # noqa: F403
from .step import *  # noqa: F403

#: ops this backend takes from the reference as they are: a few fused torch kernels already, one
#: ``index_add``, or off the hot path
REFERENCE_OPS = (
    "cascade_of",
    "grid_cell_indices",
    "grid_occupancy",
    "samples_in_use",
    "repacked_prefix_slots",
    "accumulate_along_rays",
    "per_ray_loss",
    "trunc_exp",
)
globals().update({name: getattr(_reference, name) for name in REFERENCE_OPS})

#: the wrapper modules, one per concept of the reference (``data``: the data layer's kernels)
MODULES = (rays, grid, marching, compositing, losses, step, mlp, encoding, data)

__all__ = [
    "SQRT3",
    "MISS_T",
    "PackedSamples",
    "REFERENCE_OPS",
    "is_available",
    *REFERENCE_OPS,
    *(name for module in MODULES for name in module.__all__),
]
