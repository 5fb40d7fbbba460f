"""Where the host's time goes in the Lightning training loop: cProfile over a window of optimizer steps.

    python -m nerf_lightning.train ... \
        +callbacks.loop_profile._target_=benchmarks.loop_profile.LoopProfile \
        [+callbacks.loop_profile.start=1000] [+callbacks.loop_profile.steps=500] \
        [+callbacks.loop_profile.kernel_steps=100]

The graphed step alone (``benchmarks.step_scaling``) takes 2.23 ms on lego on one H200, the same step in the
Lightning loop about 2.45 ms; below the full batch the loop is bound by its host (docs/batch_rule.md). This
callback times ``steps`` optimizer steps from ``start``, then profiles the next ``steps`` under cProfile (the
device synchronized at each mark), and writes ``loop_profile.json`` into the run directory:

- ``wall_ms_per_step``: the loop's step over ``steps`` steps from ``start``, without the profiler;
- ``profiled_ms_per_step``: over the next ``steps`` steps, under cProfile;
- ``own`` and ``cumulative``: the top functions of the profiled steps by own and by cumulative time, as
  ``[ms per step, calls per step, "file:line function"]`` (cProfile's overhead inflates every entry;
  compare functions, not totals).

With ``kernel_steps`` > 0, the ``kernel_steps`` steps after those run under ``torch.profiler`` (CPU and CUDA)
and ``loop_profile.json`` also holds ``gpu``: the GPU timeline of those steps
(``benchmarks.census.timeline_gaps``: span, the kernels' summed time (concurrent kernels each counted, so
it can exceed the span) and the time
between them per step, the largest gaps by the kernels around them), kernels per step, the
operators launched outside the CUDA graphs by device time (``eager_ops``: ``[ms per step, calls per step,
name]``), the synchronizing runtime calls per step (``syncs``) and, on a GPU, where the host waited for the
device (``sync_sites``: ``[calls per step, "file:line function <- its callers", warning]`` from
``torch.cuda.set_sync_debug_mode("warn")``).

A run shorter than ``start + 2 * steps + kernel_steps`` optimizer steps writes nothing and says so in its log.
"""

from __future__ import annotations

import cProfile
import json
import logging
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import lightning as L
import torch

from benchmarks.census import timeline_gaps, top_functions

log = logging.getLogger(__name__)

FILE = "loop_profile.json"


class LoopProfile(L.Callback):
    """The module docstring's window: ``start`` (optimizer step), ``steps`` per half, ``top`` functions."""

    def __init__(self, start: int = 1000, steps: int = 500, top: int = 40, kernel_steps: int = 0) -> None:
        if start < 0 or steps < 1 or top < 1 or kernel_steps < 0:
            raise ValueError(
                "loop_profile: start >= 0, steps >= 1, top >= 1, kernel_steps >= 0; "
                f"got {start}, {steps}, {top}, {kernel_steps}"
            )
        self.start, self.steps, self.top = int(start), int(steps), int(top)
        self.kernel_steps = int(kernel_steps)
        self._marks: list[float] = []  # wall times at start, start + steps, start + 2 * steps
        self._prof: cProfile.Profile | None = None
        self._torch_prof: Any = None
        self._sites: SyncSites | None = None
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
            if not self.kernel_steps:
                self._write(trainer)
                return
            self._torch_prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            )
            self._torch_prof.__enter__()
            if pl_module.device.type == "cuda":
                self._sites = SyncSites().__enter__()
        elif self._torch_prof is not None and step == self.start + 2 * self.steps + self.kernel_steps:
            if self._sites is not None:
                self._sites.__exit__(None, None, None)
            self._marks.append(self._sync(pl_module))
            self._torch_prof.__exit__(None, None, None)
            self._write(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._prof is not None and self.result is None:
            self._prof.disable()
        if self._torch_prof is not None and self.result is None:
            if self._sites is not None:
                self._sites.__exit__(None, None, None)
            self._torch_prof.__exit__(None, None, None)
        if self.result is None and trainer.is_global_zero:
            log.warning(
                "loop_profile: the run ended before optimizer step %d (start %d + 2 x %d + %d steps): "
                "nothing written", self.start + 2 * self.steps + self.kernel_steps, self.start, self.steps,
                self.kernel_steps,
            )  # fmt: skip

    def _write(self, trainer: L.Trainer) -> None:
        assert self._prof is not None
        t0, t1, t2 = self._marks[:3]
        self.result = {
            "start": self.start,
            "steps": self.steps,
            "wall_ms_per_step": (t1 - t0) / self.steps * 1e3,
            "profiled_ms_per_step": (t2 - t1) / self.steps * 1e3,
            "own": top_functions(self._prof, self.steps, self.top),
            "cumulative": top_functions(self._prof, self.steps, self.top, cumulative=True),
        }
        if self._torch_prof is not None:
            gpu = gpu_window(self._torch_prof, self.kernel_steps, self.top)
            self.result["gpu"] = {"wall_ms_per_step": (self._marks[3] - t2) / self.kernel_steps * 1e3, **gpu}
            sites = self._sites.counts.most_common(self.top) if self._sites is not None else []
            self.result["gpu"]["sync_sites"] = [
                [n / self.kernel_steps, where, what] for (where, what), n in sites
            ]
        if trainer.is_global_zero:
            path = Path(trainer.default_root_dir) / FILE
            path.write_text(json.dumps(self.result, indent=1))
            log.info("loop_profile: %.3f ms per step (%.3f under cProfile): %s",
                     self.result["wall_ms_per_step"], self.result["profiled_ms_per_step"], path)  # fmt: skip


#: runtime calls that make the host wait for the device
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def gpu_window(prof: Any, steps: int, top: int = 40) -> dict[str, Any]:
    """What a ``torch.profiler`` window of ``steps`` loop steps did on the GPU: the timeline
    (``timeline_gaps``), kernels per step, the CPU operators that launched kernels themselves (outside a
    CUDA graph's replay) by device time, and the synchronizing runtime calls per step."""
    events = prof.key_averages()
    cuda = torch.autograd.DeviceType.CUDA
    kernels = sum(e.count for e in events if e.device_type == cuda)
    eager = [
        (e.device_time_total / steps / 1e3, e.count / steps, e.key)
        for e in events
        if e.device_type != cuda and e.key.startswith("aten::") and e.device_time_total > 0
    ]
    syncs = {e.key: e.count / steps for e in events if any(e.key.startswith(name) for name in SYNC_CALLS)}
    return {
        "steps": steps,
        "timeline": timeline_gaps(prof, steps),
        "kernels_per_step": kernels / steps,
        "eager_ops": sorted(eager, reverse=True)[:top],
        "syncs": syncs,
    }


class SyncSites:
    """A context in which every synchronizing CUDA call (``torch.cuda.set_sync_debug_mode("warn")``) is
    counted by where it was made: ``counts[(the innermost Python frames, the warning)]``."""

    def __init__(self, frames: int = 4) -> None:
        self.frames = frames
        self.counts: Counter[tuple[str, str]] = Counter()
        self._catcher = warnings.catch_warnings()

    def __enter__(self) -> SyncSites:
        self._catcher.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._seen
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc: object) -> None:
        torch.cuda.set_sync_debug_mode("default")
        self._catcher.__exit__(*exc)

    def _seen(self, message: Warning | str, category: type[Warning], filename: str, lineno: int,
              file: Any = None, line: str | None = None) -> None:  # fmt: skip
        text = str(message)
        if "synchroniz" not in text:
            return
        stack = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename]
        frames = reversed(stack[-self.frames :])
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames)
        self.counts[(where, text.split("\n")[0][:120])] += 1
