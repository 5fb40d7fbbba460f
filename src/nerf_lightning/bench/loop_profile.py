"""Where the host's time goes in the Lightning training loop: cProfile over a window of optimizer steps.

    python -m nerf_lightning.train ... \
        +callbacks.loop_profile._target_=nerf_lightning.bench.loop_profile.LoopProfile \
        [+callbacks.loop_profile.start=1000] [+callbacks.loop_profile.steps=500]

The bare graphed step (``bench.step_scaling``) takes 2.25 ms on lego on one H200, the same step in the
Lightning loop 2.47 ms (docs/batch_rule.md): the loop's host work per step exceeds what the GPU hides. This
callback times ``steps`` optimizer steps from ``start``, then profiles the next ``steps`` under cProfile (the
device synchronized at each mark), and writes ``loop_profile.json`` into the run directory:

- ``wall_ms_per_step``: the loop's step over ``steps`` steps from ``start``, without the profiler;
- ``profiled_ms_per_step``: over the next ``steps`` steps, under cProfile;
- ``own`` and ``cumulative``: the top functions of the profiled steps by own and by cumulative time, as
  ``[ms per step, calls per step, "file:line function"]`` (cProfile's overhead inflates every entry;
  compare functions, not totals).

A run shorter than ``start + 2 * steps`` optimizer steps writes nothing and says so in its log.
"""

from __future__ import annotations

import cProfile
import json
import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch

from nerf_lightning.bench.census import top_functions

log = logging.getLogger(__name__)

FILE = "loop_profile.json"


class LoopProfile(L.Callback):
    """The module docstring's window: ``start`` (optimizer step), ``steps`` per half, ``top`` functions."""

    def __init__(self, start: int = 1000, steps: int = 500, top: int = 40) -> None:
        if start < 0 or steps < 1 or top < 1:
            raise ValueError(f"loop_profile: start >= 0, steps >= 1, top >= 1; got {start}, {steps}, {top}")
        self.start, self.steps, self.top = int(start), int(steps), int(top)
        self._marks: list[float] = []  # wall times at start, start + steps, start + 2 * steps
        self._prof: cProfile.Profile | None = None
        self.result: dict[str, Any] | None = None

    @staticmethod
    def _sync(pl_module: L.LightningModule) -> float:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if not self._marks and step == self.start:
            self._marks.append(self._sync(pl_module))
        elif len(self._marks) == 1 and step == self.start + self.steps:
            self._marks.append(self._sync(pl_module))
            self._prof = cProfile.Profile()
            self._prof.enable()
        elif len(self._marks) == 2 and self._prof is not None and step == self.start + 2 * self.steps:
            self._prof.disable()
            self._marks.append(self._sync(pl_module))
            self._write(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._prof is not None and self.result is None:
            self._prof.disable()
        if self.result is None and trainer.is_global_zero:
            log.warning(
                "loop_profile: the run ended before optimizer step %d (start %d + 2 x %d steps): "
                "nothing written", self.start + 2 * self.steps, self.start, self.steps,
            )  # fmt: skip

    def _write(self, trainer: L.Trainer) -> None:
        assert self._prof is not None
        t0, t1, t2 = self._marks
        self.result = {
            "start": self.start,
            "steps": self.steps,
            "wall_ms_per_step": (t1 - t0) / self.steps * 1e3,
            "profiled_ms_per_step": (t2 - t1) / self.steps * 1e3,
            "own": top_functions(self._prof, self.steps, self.top),
            "cumulative": top_functions(self._prof, self.steps, self.top, cumulative=True),
        }
        if trainer.is_global_zero:
            path = Path(trainer.default_root_dir) / FILE
            path.write_text(json.dumps(self.result, indent=1))
            log.info("loop_profile: %.3f ms per step (%.3f under cProfile): %s",
                     self.result["wall_ms_per_step"], self.result["profiled_ms_per_step"], path)  # fmt: skip
