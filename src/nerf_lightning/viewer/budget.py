"""When the live viewer may render during training, and for how long: a credit budget spent in bursts.

On a GPU the training step is asynchronous: the host queues a step and moves on while the device runs
it, so the host's wall time per step is mostly launch time and the device is a few steps behind.
Anything the viewer renders has to be waited for (the picture goes to the browser), which drains that
queue, and after it the device idles until the host has launched the next step. Rendering a little
at every step pays that drained pipeline at every step, a cost that no timer around the render sees.
So the viewer renders in bursts, at most one every ``burst_every_s``:

- credit is earned at ``budget`` seconds per second of training wall time, at most ``max_bank_s``
  banked beyond the expected refill (below);
- a burst starts with one device synchronize. While the host waits there the device runs the queued
  training steps, so that wait is training time: it earns credit and is not charged. The burst then
  renders for the credit left after the expected refill, and its wall time from the end of the
  synchronize is charged;
- the first step after a burst is charged and earns nothing (the refill: the device waits for its
  launch, at most that step's host time), up to the mean step time before the burst, so that a
  validation or a checkpoint write that falls into that step is not charged as a refill. On a
  device that does not run ahead of the host (the CPU) there is no refill to charge.

Every second of the run is either earned or charged, and the charge can exceed the credit by at most
one render chunk, so the time charged (rendering and refills) is at most ``budget / (1 + budget)`` of
the run (7.4 % at 0.08) plus one bank and one chunk. A burst happens only when the credit covers the
expected refill plus ``min_burst_s`` of rendering, so a device whose steps are slow (a large refill)
gets fewer, larger bursts instead of bursts that are all refill.

:class:`BurstBudget` is the accounting alone, on an injectable clock; ``viewer/callback.py`` calls it
from the training loop and does the synchronize and the rendering.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["BurstBudget"]


class BurstBudget:
    """The viewer's render credit during training (see the module docstring).

    Args (``budget``, ``burst_every_s`` and ``max_bank_s`` > 0: ``ViewerCallback``'s annotations):
        budget: render seconds earned per second of training.
        burst_every_s: least wall time between two bursts.
        max_bank_s: most render seconds banked (beyond the expected refill).
        pipelined: the device runs ahead of the host (a GPU): the step after a burst is charged.
        min_burst_s: least render time worth a burst (None: half of what ``burst_every_s`` earns).
        clock: seconds, monotonic (``time.perf_counter``; tests pass a simulated one).
    """

    def __init__(
        self,
        budget: float,
        burst_every_s: float,
        max_bank_s: float,
        *,
        pipelined: bool,
        min_burst_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.budget, self.burst_every_s, self.max_bank_s = (
            float(budget),
            float(burst_every_s),
            float(max_bank_s),
        )
        self.pipelined = bool(pipelined)
        self.min_burst_s = (
            0.5 * self.budget * self.burst_every_s if min_burst_s is None else float(min_burst_s)
        )
        self.clock = clock
        self.credit = 0.0
        #: the last refill charged (the first step after a burst): what the next burst keeps aside
        self.refill_s = 0.0
        #: totals for the run's summary: burst wall time after the synchronize, refills, bursts
        self.burst_s = 0.0
        self.charged_refill_s = 0.0
        self.bursts = 0
        self._earned_to = 0.0
        self._next = 0.0
        self._refill_from: float | None = None
        self._opened: float | None = None
        # the steps since the last burst, for the mean step time that caps the next refill
        self._steps = 0
        self._steps_from = 0.0
        self._mean_step_s = 0.0
        self.restart()

    def restart(self) -> None:
        """Earning starts now (fit start, the end of a pause: no refill of ours to charge)."""
        now = self.clock()
        self._earned_to = self._steps_from = now
        self._steps = 0
        self._next = now + self.burst_every_s
        self._refill_from = None

    def _earn(self, now: float) -> None:
        earned = self.budget * max(now - self._earned_to, 0.0)
        self.credit = min(self.credit + earned, self.max_bank_s + self.refill_s)
        self._earned_to = now

    def step(self) -> bool:
        """Once per training step (one clock read): whether a burst may be due now. When True, call
        :meth:`wait` or :meth:`open`."""
        now = self.clock()
        if self._refill_from is not None:  # the first step after a burst: charged, not earned
            self.refill_s = min(now - self._refill_from, self._mean_step_s)
            self.credit -= self.refill_s
            self.charged_refill_s += self.refill_s
            self._earned_to = max(self._earned_to, self._refill_from + self.refill_s)
            self._refill_from = None
            self._steps, self._steps_from = 0, now
        else:
            self._steps += 1
        if now < self._next:
            return False
        self._earn(now)
        if self._steps:
            self._mean_step_s = (now - self._steps_from) / self._steps
        return True

    @property
    def affordable(self) -> bool:
        """The credit covers the expected refill and ``min_burst_s`` of rendering."""
        return self.credit - self.refill_s >= self.min_burst_s

    def wait(self) -> None:
        """Nothing to render, or not enough credit: look again in ``burst_every_s``."""
        self._next = self.clock() + self.burst_every_s

    def open(self) -> float:
        """The burst starts (right after the device synchronize): the wait earns, and the return
        is the render seconds available (the credit less the expected refill)."""
        now = self.clock()
        self._earn(now)
        self._opened = now
        return max(self.credit - self.refill_s, 0.0)

    @property
    def remaining_s(self) -> float:
        """Render seconds left in the open burst."""
        spent = 0.0 if self._opened is None else self.clock() - self._opened
        return max(self.credit - self.refill_s - spent, 0.0)

    def close(self) -> float:
        """The burst ends: its wall time since :meth:`open` is charged (returned); the next step refills."""
        if self._opened is None:
            raise RuntimeError("BurstBudget.close() without open()")
        now = self.clock()
        spent = now - self._opened
        self.credit -= spent
        self.burst_s += spent
        self.bursts += 1
        self._opened = None
        self._earned_to = now
        self._next = now + self.burst_every_s
        self._refill_from = now if self.pipelined else None
        return spent
