"""Ray ops: one contract (the docstrings of ``ops/reference``), two backends, one registry.

- ``reference/``: pure PyTorch, any device, the test oracle; one module per concept.
- ``cuda/``: our CUDA extension (``csrc/``, built on first use by ``_ext.py``), the same functions.
- ``registry.py``: the op list (derived from the reference), :class:`Backend` (``model.net.backend``, the
  one backend of the training step, which the model's components hold), :func:`get_ops`
  (``auto | cuda | torch``), the hash encoding's implementation choice and the data layer's kernels.
"""

from __future__ import annotations

from . import reference, registry
from .registry import *  # noqa: F403
from .types import PackedSamples

__all__ = ["PackedSamples", "reference", *registry.__all__]
