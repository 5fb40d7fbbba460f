"""tiny-cuda-nn's Adam as instant-ngp's NeRF runs it, in PyTorch, for the A/B of issue 64.

    python -m nerf_lightning.train ... model.optimizer._target_=benchmarks.tcnn_adam.TcnnAdam \
        [+model.optimizer.l2_reg=1e-6]

Two things tiny-cuda-nn's ``adam_step`` (``include/tiny-cuda-nn/optimizers/adam.h``) does that
``torch.optim.Adam`` does not:

- **Entries without a gradient stand still.** For the parameters outside the MLPs' matrices (the hash
  table) ``skip_zero_grad_non_matrix_params`` is on by default: an entry whose gradient is exactly 0 this
  step is not updated, and its moments do not decay. ``torch.optim.Adam`` moves every entry by its momentum
  for steps after the last ray touched it. Each entry counts its own steps for the debiasing
  (``param_steps[i]``), as there.
- **``l2_reg`` on the MLPs' matrices only** (``gradient += l2_reg * weight``; the table's
  ``non_matrix_l2_reg`` defaults to 0). instant-ngp's ``configs/nerf/base.json`` sets ``l2_reg`` 1e-6.

Groups are read by the names ``NeRFModule`` gives them (``models/optimization.py``): ``table`` is the
sparse one, every other group (``mlp``, per-view corrections) gets plain Adam with the L2 term on
``mlp`` only. Unfused element-wise kernels: a quality screen at fixed steps, not a speed candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

__all__ = ["TcnnAdam"]


class TcnnAdam(torch.optim.Optimizer):
    """Adam with tiny-cuda-nn's sparse update of the hash table and L2 on the MLPs (module docstring).

    Args:
        params: parameter groups; a group named ``table`` skips entries whose gradient is 0.
        lr, betas, eps: as ``torch.optim.Adam`` (instant-ngp: 1e-2, (0.9, 0.99), 1e-15).
        l2_reg: added as ``l2_reg * weight`` to the gradient of the group named ``mlp``.
        fused: accepted for the config's sake (``model.optimizer.fused``) and ignored.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-2,
        betas: tuple[float, float] = (0.9, 0.99),
        eps: float = 1e-15,
        l2_reg: float = 1e-6,
        fused: bool | None = None,
    ) -> None:
        if lr <= 0 or eps < 0 or l2_reg < 0 or not all(0.0 <= b < 1.0 for b in betas):
            got = f"lr={lr}, eps={eps}, l2_reg={l2_reg}, betas={betas}"
            raise ValueError(f"TcnnAdam: expected lr > 0, eps >= 0, l2_reg >= 0, betas in [0, 1); got {got}")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "l2_reg": l2_reg})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            sparse = group.get("name") == "table"
            l2 = group["l2_reg"] if group.get("name") == "mlp" else 0.0
            for p in group["params"]:
                if p.grad is None:
                    continue
                self._update(p, group, sparse, l2)
        return loss

    def _update(self, p: Tensor, group: dict[str, Any], sparse: bool, l2: float) -> None:
        beta1, beta2 = group["betas"]
        state = self.state[p]
        if not state:
            state["m"] = torch.zeros_like(p, dtype=torch.float32)
            state["v"] = torch.zeros_like(p, dtype=torch.float32)
            state["k"] = torch.zeros_like(p, dtype=torch.float32)  # steps per entry (exact up to 2^24)
        m, v, k = state["m"], state["v"], state["k"]
        g = p.grad.float()
        w = p.float()
        if l2:
            g = g + l2 * w
        if sparse:
            touched = g != 0
            k.add_(touched.float())
            m.copy_(torch.where(touched, beta1 * m + (1 - beta1) * g, m))
            v.copy_(torch.where(touched, beta2 * v + (1 - beta2) * g * g, v))
        else:
            touched = None
            k.add_(1.0)
            m.mul_(beta1).add_(g, alpha=1 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        kc = k.clamp_min(1.0)
        rate = group["lr"] * torch.sqrt(1 - torch.pow(beta2, kc)) / (1 - torch.pow(beta1, kc))
        new = w - rate * m / (v.sqrt() + group["eps"])
        if touched is not None:
            new = torch.where(touched, new, w)
        p.copy_(new)
