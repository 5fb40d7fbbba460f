"""Which batch rule reaches a held-out PSNR first on N GPUs, predicted from measurements on one GPU.

    python -m benchmarks.batch_rule --from OUT/rows.jsonl [--gpus 2,4,8] [--busbw-gbs 350]
        [--latency-us 20] [--buckets 1] [--hbm-gbs 4000] [--json PATH]

Reads the benchmark runner's rows (experiments ``batch-rule-*``, ``benchmarks/experiments.py``):

A. **step rows** (``benchmarks.step_scaling``): the graphed step alone at ``s`` x the batch (s = 1, 1/2, 1/4,
   1/8), its gradient's bytes and the fraction of hash-table rows one step's gradient touches;
B. **curve rows** (one GPU drawing k batches, ``benchmarks.batch_rules.imitated``; rows before 2026-12-05:
``data.batch_multiple=k``): the
   held-out PSNR every 1000 reference steps; the optimizer steps to each target are read off by linear
   interpolation between the two validations around the first crossing;
B, sized (experiment ``batch-rule-sized``): runs of one k and rule sized to several lengths; the shortest
   length whose final PSNR reaches each target, interpolated between two lengths (:func:`sized_table`);
C. **synchronisation**, which one GPU cannot measure, from the gradient's bytes: a ring all-reduce moves
   ``2 (N - 1) / N`` x the bytes through each GPU's link, at NCCL's bus bandwidth ``--busbw-gbs``, plus
   ``--buckets`` x ``--latency-us`` (the strategy's ``bucket_cap_mb`` makes the whole gradient one DDP
   bucket: one collective). ``bf16``
   halves the bytes and adds the casts there and back (``3 x`` the float32 bytes through HBM at
   ``--hbm-gbs``); ``rows`` sends only the touched rows (an int32 index and the features each) with an
   all-gather, ``(N - 1)`` x one rank's message. Not overlapped with compute: the graphed backward ends
   before DDP's reducer sees the gradients.
D. **the occupancy update that N ranks share**: each rank evaluates ``1/N`` of the update's cells
   (``OccupancyGrid.update(share=...)``) and the grid is all-reduced (MAX) after it, every
   ``grid_update_every`` steps. A rank's step on N GPUs (:func:`rank_step_ms`) is the step alone less
   ``(u(1) - u(1/N)) / every`` (``u``: the update's GPU time at a share, measured by
   ``benchmarks.step_scaling``) plus the grid's all-reduce over the same cadence (one collective of the
   grid's float32 bytes).

Predicted time to each target on N GPUs (the 1-GPU time: the k = 1 run's steps x t(1); t at N ranks is
:func:`rank_step_ms`):

- ``global`` (one GPU's batch split over the ranks, the same steps): k = 1's steps x (t(1/N) + sync);
- every per-device rule (each rank the whole batch: ``per_device``, ``per_device_rays``, ``sqrt_lr``,
  ``linear_lr``): the k = N run's steps x (t(1) + sync). A rule without a k = N run is extrapolated from
  its largest measured k (reference steps to the target ~ k^a through k = 1 and that k), marked ``~``.

Assumptions (stated in the output): H200 NVLink 4 carries 450 GB/s per direction (900 GB/s both ways);
NCCL's ring all-reduce without NVLink multicast reaches about 350 GB/s of bus bandwidth on large messages.
Prints Markdown tables (for BENCHMARKS.md): the exchange per N, then per capture and target the predicted
time of each rule as a fraction of the 1-GPU time, the winner per N, and the PSNR at the end of each
k = N run against the k = 1 run (the same reference steps: equal wall time x N).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

#: held-out PSNR targets per capture [dB]
TARGETS: dict[str, tuple[float, ...]] = {"lego": (35.5, 36.2), "fox": (29.0,)}
#: (learning-rate factor, schedule unit) -> the per-device rule of ``training/clock.py`` that trains so
RULE_OF = {
    ("none", "steps"): "per_device",
    ("none", "rays"): "per_device_rays",
    ("sqrt", "rays"): "sqrt_lr",
    ("linear", "rays"): "linear_lr",
}
EXCHANGES = ("fp32", "bf16", "rows")


@dataclass(frozen=True)
class Network:
    """The interconnect and memory assumptions of the synchronisation model (module docstring)."""

    busbw_gbs: float = 350.0
    latency_us: float = 20.0
    buckets: int = 1
    hbm_gbs: float = 4000.0

    def allreduce_ms(self, nbytes: float, n: int, collectives: int | None = None) -> float:
        """A ring all-reduce of ``nbytes`` over ``n`` GPUs in ``collectives`` calls (None: the gradient's
        ``buckets``), in ms (0 for one GPU)."""
        if n <= 1:
            return 0.0
        calls = self.buckets if collectives is None else collectives
        return 2 * (n - 1) / n * nbytes / (self.busbw_gbs * 1e9) * 1e3 + calls * self.latency_us / 1e3

    def allgather_ms(self, nbytes_per_rank: float, n: int) -> float:
        """An all-gather of ``nbytes_per_rank`` from each of ``n`` GPUs, in ms."""
        if n <= 1:
            return 0.0
        return (n - 1) * nbytes_per_rank / (self.busbw_gbs * 1e9) * 1e3 + self.buckets * self.latency_us / 1e3

    def grid_sync_ms(self, nbytes: float, n: int) -> float:
        """The occupancy grid's MAX all-reduce over ``n`` GPUs after an update (one collective), in ms."""
        return self.allreduce_ms(nbytes, n, collectives=1)

    def exchange_ms(self, kind: str, grad: GradientSize, n: int) -> float:
        """One step's gradient exchange over ``n`` GPUs, in ms."""
        if n <= 1:
            return 0.0
        if kind == "fp32":
            return self.allreduce_ms(grad.fp32_bytes, n)
        if kind == "bf16":
            casts = 3 * grad.fp32_bytes / (self.hbm_gbs * 1e9) * 1e3
            return self.allreduce_ms(grad.fp32_bytes / 2, n) + casts
        if kind == "rows":
            rows = grad.touched_fraction * grad.table_rows * (4 + 4 * grad.table_features)
            return self.allgather_ms(rows, n) + self.allreduce_ms(grad.fp32_bytes - grad.table_bytes, n)
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {kind!r}")


@dataclass(frozen=True)
class GradientSize:
    """What one step all-reduces: float32 bytes in all, of the table, its shape and touched rows."""

    fp32_bytes: float
    table_bytes: float
    table_rows: int
    table_features: int
    touched_fraction: float


@dataclass
class Curve:
    """One training run on one GPU: its global batch k, learning-rate factor, unit and PSNR curve."""

    scene: str
    k: float
    lr_scaling: str
    unit: str
    points: list[tuple[int, float]]  # (optimizer step, held-out PSNR)
    final_psnr: float | None = None
    job: str = ""
    lr_anneal: float | None = None  # data.lr_anneal
    steps: int | None = None  # optimizer steps trained
    mlp_lr_scaling: str | None = None  # data.mlp_lr_scaling
    schedule: str | None = None  # the learning-rate decay where not the default (readers.lr_schedule)
    gradients: str | None = None  # "bf16": rounded before each step (readers.rounded_gradients)
    beta_scaling: str | None = None  # data.beta_scaling

    @property
    def rule(self) -> str:
        name = RULE_OF.get((self.lr_scaling, self.unit), f"lr {self.lr_scaling}, {self.unit}")
        if self.lr_anneal is not None:
            name += f", anneal {self.lr_anneal:g}"
        if self.mlp_lr_scaling is not None:
            name += f", MLPs lr {self.mlp_lr_scaling}"
        if self.beta_scaling not in (None, "none"):
            name += f", betas {self.beta_scaling}"
        if self.schedule is not None:
            name += f", {self.schedule}"
        return name if self.gradients is None else f"{name}, {self.gradients} gradients"

    @property
    def length(self) -> float | None:
        """The run's length in reference steps (optimizer steps x k under a rule in rays)."""
        if self.steps is None:
            return None
        return self.steps * (self.k if self.unit == "rays" else 1.0)


@dataclass
class Prediction:
    """Predicted time to one target on ``n`` GPUs under one rule and exchange."""

    scene: str
    target: float
    n: int
    rule: str
    exchange: str
    steps: float | None
    step_ms: float | None
    sync_ms: float
    seconds: float | None
    ratio: float | None
    extrapolated_from: float | None = None
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ reading rows
def steps_to(points: Sequence[tuple[float, float]], target: float) -> float | None:
    """The optimizer step at which a PSNR curve first reaches ``target``: linear interpolation between the
    last validation below it and the first at or above it; the first validation's step when that one is
    already above; None when the curve never gets there."""
    previous: tuple[float, float] | None = None
    for step, psnr in sorted(points):
        if psnr >= target:
            if previous is None:
                return float(step)
            s0, p0 = previous
            return s0 + (target - p0) / (psnr - p0) * (step - s0)
        previous = (step, psnr)
    return None


def load_rows(path: Path) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not a JSON object ({err})") from None
    return rows


def step_times(rows: Iterable[dict[str, Any]]) -> dict[str, dict[float, dict[str, Any]]]:
    """Scene -> scale -> the step row (``benchmarks.step_scaling``; the last row of a scale wins)."""
    out: dict[str, dict[float, dict[str, Any]]] = {}
    for r in rows:
        if r.get("step_ms") is not None and r.get("scale") is not None and r.get("status", "ok") == "ok":
            out.setdefault(str(r.get("scene") or "?"), {})[float(r["scale"])] = r
    return out


def curves(rows: Iterable[dict[str, Any]]) -> list[Curve]:
    """The training runs with a PSNR curve (``readers.val_curve``)."""
    out = []
    for r in rows:
        if not r.get("curve") or r.get("status", "ok") != "ok":
            continue
        points = [(int(s), float(p)) for s, p in r["curve"]]
        out.append(
            Curve(
                str(r.get("scene") or "?"),
                float(r.get("k") or 1.0),
                str(r.get("lr_scaling") or "none"),
                str(r.get("unit") or "steps"),
                points,
                r.get("psnr"),
                str(r.get("id", "")),
                None if r.get("lr_anneal") is None else float(r["lr_anneal"]),
                None if r.get("steps") is None else int(r["steps"]),
                r.get("mlp_lr_scaling"),
                r.get("schedule"),
                r.get("gradients"),
                r.get("beta_scaling"),
            )
        )
    return out


# ---------------------------------------------------------------------------------------------- model
def gradient_size(step_rows: dict[float, dict[str, Any]]) -> GradientSize:
    """From the full-batch step row (its touched fraction is that of a per-device rank's step)."""
    r = step_rows.get(1.0) or next(iter(step_rows.values()))
    return GradientSize(
        float(r["grad_bytes"]),
        float(r["table_bytes"]),
        int(r["table_rows"]),
        int(r["table_features"]),
        float(r["touched_fraction"]),
    )


def rank_step_ms(row: dict[str, Any], n: int, net: Network) -> float:
    """One rank's step on ``n`` GPUs from a step row of one GPU (module docstring, D): the step alone, less
    what the ranks' shares of the occupancy update save, plus the grid's all-reduce; the step alone for a
    row without the update's times at ``n`` (or for one GPU)."""
    t = float(row["step_ms"])
    shares = row.get("grid_update_ms") or {}
    if n <= 1 or "1" not in shares or str(n) not in shares:
        return t
    every = float(row["grid_update_every"])
    return t - (shares["1"] - shares[str(n)]) / every + net.grid_sync_ms(float(row["grid_bytes"]), n) / every


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def predict(
    rows: list[dict[str, Any]], gpus: Sequence[int], net: Network, exchanges: Sequence[str] = EXCHANGES
) -> list[Prediction]:
    """Every rule's predicted time to every target at every N (module docstring)."""
    times, runs = step_times(rows), curves(rows)
    out: list[Prediction] = []
    for scene, targets in TARGETS.items():
        scene_runs = [c for c in runs if c.scene == scene]
        steps_rows = times.get(scene) or (next(iter(times.values())) if times else None)
        if not scene_runs or not steps_rows or 1.0 not in steps_rows:
            continue
        t1 = float(steps_rows[1.0]["step_ms"])
        borrowed = [] if scene in times else [f"step times of {next(iter(times))}"]
        base_runs = [c for c in scene_runs if c.k == 1.0]
        for target in targets:
            base_steps = _mean([s for c in base_runs if (s := steps_to(c.points, target)) is not None])
            base_s = base_steps * t1 / 1e3 if base_steps is not None else None
            for n in gpus:
                rank_rows = steps_rows.get(1.0 / n)  # one rank's step under `global`
                candidates: list[tuple[str, float | None, dict[str, Any] | None, float | None]] = [
                    ("global", base_steps, rank_rows, None)
                ]
                for rule in sorted({c.rule for c in scene_runs if c.k > 1.0}):
                    steps, source = _rule_steps(scene_runs, rule, n, target)
                    candidates.append((rule, steps, steps_rows[1.0], source))
                for kind in exchanges:
                    for rule, steps, step_row, source in candidates:
                        out.append(
                            _prediction(
                                scene, target, n, rule, kind, steps, step_row, source, net, base_s, borrowed
                            )
                        )
    return out


def _prediction(
    scene: str,
    target: float,
    n: int,
    rule: str,
    kind: str,
    steps: float | None,
    step_row: dict[str, Any] | None,
    source: float | None,
    net: Network,
    base_s: float | None,
    notes: list[str],
) -> Prediction:
    """One cell: ``steps`` x (the step time of ``step_row`` + its gradient's exchange over ``n`` GPUs)."""
    if step_row is None:
        return Prediction(
            scene,
            target,
            n,
            rule,
            kind,
            steps,
            None,
            0.0,
            None,
            None,
            source,
            [*notes, f"no step time at 1/{n} of the batch"],
        )
    t_step = rank_step_ms(step_row, n, net)
    sync = net.exchange_ms(kind, gradient_size({1.0: step_row}), n)
    p = Prediction(scene, target, n, rule, kind, steps, t_step, sync, None, None, source, list(notes))
    if steps is None:
        p.notes.append("target not reached")
    else:
        p.seconds = steps * (t_step + sync) / 1e3
        p.ratio = p.seconds / base_s if base_s else None
    return p


def _rule_steps(runs: list[Curve], rule: str, n: int, target: float) -> tuple[float | None, float | None]:
    """Optimizer steps to ``target`` at k = n under ``rule``: measured, else extrapolated from its largest
    measured k (reference steps ~ k^a through k = 1); returns (steps, k extrapolated from or None)."""
    at_n = [s for c in runs if c.rule == rule and c.k == n if (s := steps_to(c.points, target)) is not None]
    if at_n:
        return sum(at_n) / len(at_n), None
    if any(c.rule == rule and c.k == n for c in runs):
        return None, None  # measured, and the target was not reached
    base = _mean([s for c in runs if c.k == 1.0 if (s := steps_to(c.points, target)) is not None])
    measured = sorted({c.k for c in runs if c.rule == rule and c.k > 1.0})
    if base is None or not measured:
        return None, None
    k = measured[-1]
    at_k = _mean(
        [s for c in runs if c.rule == rule and c.k == k if (s := steps_to(c.points, target)) is not None]
    )
    if at_k is None:
        return None, None
    a = math.log(at_k * k / base) / math.log(k)  # reference steps at k = base * k^a
    return base * n**a / n, k


# -------------------------------------------------------------------------------------------- output
def _fmt(v: float | None, spec: str, none: str = "-") -> str:
    return none if v is None else format(v, spec)


def exchange_table(rows: list[dict[str, Any]], gpus: Sequence[int], net: Network) -> str:
    """C: the exchange per N for each capture's gradient, in ms and as a share of the full-batch step."""
    lines = [
        "| capture | gradient | table rows touched | N | fp32 all-reduce | bf16 all-reduce "
        "| touched rows only |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for scene, steps_rows in step_times(rows).items():
        if 1.0 not in steps_rows:
            continue
        grad, t1 = gradient_size(steps_rows), float(steps_rows[1.0]["step_ms"])
        for n in gpus:
            cells = [
                f"{net.exchange_ms(k, grad, n):.3f} ms ({net.exchange_ms(k, grad, n) / t1 * 100:.1f} %)"
                for k in EXCHANGES
            ]
            lines.append(
                f"| {scene} | {grad.fp32_bytes / 1e6:.1f} MB | {grad.touched_fraction * 100:.1f} % "
                f"| {n} | " + " | ".join(cells) + " |"
            )
    return "\n".join(lines)


def step_table(rows: list[dict[str, Any]]) -> str:
    """A: time per step against rays per step, and the GPU time of a rank's share (N = 1, 2, 4, 8) of the
    occupancy update and of Adam."""
    lines = [
        "| capture | batch | rays per step | samples per step | ms per step | ms per 1M samples "
        "| occupancy update, 1/N of it (N = 1 / 2 / 4 / 8) | Adam over 1/N |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for scene, steps_rows in step_times(rows).items():
        for scale in sorted(steps_rows, reverse=True):
            r = steps_rows[scale]
            per = r["step_ms"] / max(r.get("samples_per_step") or 1.0, 1.0) * 1e6
            shared = [
                " / ".join(f"{ms:.3f}" for ms in (r.get(key) or {}).values()) or "-"
                for key in ("grid_update_ms", "adam_ms")
            ]
            lines.append(
                f"| {scene} | B x {scale:g} | {r.get('rays_per_step', 0):.0f} | "
                f"{r.get('samples_per_step', 0):.0f} | {r['step_ms']:.3f} | {per:.3f} | "
                + " | ".join(f"{cell} ms" if cell != "-" else cell for cell in shared) + " |"
            )
    return "\n".join(lines)


def curve_table(rows: list[dict[str, Any]]) -> str:
    """B: optimizer steps (and reference steps) to each target, and the final PSNR, per run."""
    lines = [
        "| capture | k | rule | steps to targets (reference steps) | final PSNR | run |",
        "| --- | ---: | --- | --- | ---: | --- |",
    ]
    for c in sorted(curves(rows), key=lambda c: (c.scene, c.k, c.rule)):
        reach = []
        for t in TARGETS.get(c.scene, ()):
            s = steps_to(c.points, t)
            reach.append(f"{t:g} dB: " + ("not reached" if s is None else f"{s:.0f} ({s * c.k:.0f})"))
        lines.append(
            f"| {c.scene} | {c.k:g} | {c.rule} | {'; '.join(reach)} | {_fmt(c.final_psnr, '.3f')} | {c.job} |"
        )
    return "\n".join(lines)


def length_to(runs: Sequence[tuple[float, float]], target: float) -> tuple[float | None, str]:
    """The shortest run length that ends at ``target``, from ``(length, final PSNR)`` of runs sized to
    several lengths: linear interpolation between the longest run below it and the shortest at or above
    it. Returns (length, how it was read): ``"<="`` when the shortest run already ends above (an upper
    bound), ``"not reached"`` when none does."""
    ordered = sorted(runs)
    for i, (length, psnr) in enumerate(ordered):
        if psnr >= target:
            if i == 0:
                return length, "<="
            l0, p0 = ordered[i - 1]
            return l0 + (target - p0) / (psnr - p0) * (length - l0), ""
    return None, "not reached"


def _bound_mark(how: str, base_how: str) -> str:
    """The mark of a ratio of two readings of :func:`length_to`: an upper bound over an exact reading is
    one too (``<=``), an exact reading over an upper bound a lower bound (``>=``), two upper bounds
    neither (``~``)."""
    return {("<=", ""): "<=", ("", "<="): ">=", ("<=", "<="): "~"}.get((how, base_how), "")


def sized_groups(rows: list[dict[str, Any]]) -> dict[tuple[str, float, str], list[tuple[float, float]]]:
    """(capture, k, rule) -> ``[(run length in reference steps, mean final PSNR of its seeds)]`` for every
    group of runs sized to two or more lengths."""
    by_length: dict[tuple[str, float, str], dict[float, list[float]]] = {}
    for c in curves(rows):
        if c.length is not None and c.final_psnr is not None:
            by_length.setdefault((c.scene, c.k, c.rule), {}).setdefault(c.length, []).append(c.final_psnr)
    return {
        key: [(length, sum(p) / len(p)) for length, p in runs.items()]
        for key, runs in by_length.items()
        if len(runs) > 1
    }


def base_lengths(
    groups: dict[tuple[str, float, str], list[tuple[float, float]]],
) -> dict[tuple[str, float], tuple[float | None, str]]:
    """(capture, target) -> k = 1's shortest run length to the target and how it was read
    (:func:`length_to`), from :func:`sized_groups`."""
    return {
        (sc, t): length_to(runs, t)
        for (sc, k, _), runs in groups.items()
        if k == 1.0
        for t in TARGETS.get(sc, ())
    }


def sized_table(rows: list[dict[str, Any]], net: Network) -> str:
    """B for runs sized to end at a target (experiment ``batch-rule-sized``): per capture, k and rule with
    runs of two or more lengths, the final PSNR of each (the mean over the seeds of a length) and the
    shortest length that ends at each target; at N = k the optimizer steps of that length against the
    k = 1 length, and, with a step row of the capture, the predicted time (steps x (a rank's step at B,
    :func:`rank_step_ms`, + the float32 exchange)) against the 1-GPU time."""
    groups = sized_groups(rows)
    if not groups:
        return "(no runs sized to several lengths)"
    times = step_times(rows)
    base = base_lengths(groups)
    lines = [
        "| capture | k | rule | final PSNR by length (reference steps) | target | shortest length to it "
        "| optimizer steps / k = 1's | predicted time / 1 GPU |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for (scene, k, rule), runs in sorted(groups.items()):
        finals = ", ".join(f"{length / 1000:g}k: {psnr:.3f}" for length, psnr in sorted(runs))
        # a rank's step at the full batch plus its exchange over k GPUs, against the 1-GPU step
        step_row, slowdown = (times.get(scene) or {}).get(1.0), None
        if step_row is not None:
            t1, rank = float(step_row["step_ms"]), rank_step_ms(step_row, int(k), net)
            slowdown = (rank + net.exchange_ms("fp32", gradient_size({1.0: step_row}), int(k))) / t1
        for target in TARGETS.get(scene, ()):
            length, how = length_to(runs, target)
            base_length, base_how = base.get((scene, target), (None, ""))
            ratio = time = "-"
            if length is not None and base_length:
                steps_ratio = length / k / base_length
                mark = _bound_mark(how, base_how)
                ratio = f"{mark}{steps_ratio:.2f}x"
                time = "-" if slowdown is None else f"{mark}{steps_ratio * slowdown:.2f}x"
            reach = how if length is None else f"{how}{length:.0f}"
            lines.append(
                f"| {scene} | {k:g} | {rule} | {finals} | {target:g} dB | {reach} | {ratio} | {time} |"
            )
    return "\n".join(lines)


def split_table(rows: list[dict[str, Any]], gpus: Sequence[int], net: Network) -> str:
    """B, sized, on more GPUs than reference batches: a global batch of k reference batches split over
    N > k GPUs, each rank drawing k / N of the batch (``data.batch_multiple=k/N`` under the k = N rule's
    learning rate and schedules, e.g. k = 3 on 4 GPUs at 3/4 each). Per capture, target, sized group
    (k, rule) and N: the k-run's optimizer steps to the target x (a rank's step at k / N of the batch,
    :func:`rank_step_ms`, + the exchange over N GPUs), against k = 1's steps x t(1)."""
    groups = sized_groups(rows)
    base = base_lengths(groups)
    times = step_times(rows)
    lines = [
        "| capture | k | rule | N | target | shortest length to it | a rank's batch | a rank's step "
        "| exchange | predicted time / 1 GPU |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for (scene, k, rule), runs in sorted(groups.items()):
        steps_rows = times.get(scene) or {}
        if k == 1.0 or 1.0 not in steps_rows:
            continue
        t1 = float(steps_rows[1.0]["step_ms"])
        grad = gradient_size(steps_rows)
        for target in TARGETS.get(scene, ()):
            length, how = length_to(runs, target)
            base_length, base_how = base.get((scene, target), (None, ""))
            for n in gpus:
                rank = steps_rows.get(k / n)
                if n <= k or rank is None or length is None or not base_length or how == "<=":
                    continue  # (a run already above the target at its shortest length bounds nothing)
                mark = _bound_mark(how, base_how)
                t = rank_step_ms(rank, n, net)
                for kind in ("fp32", "bf16"):
                    ratio = (length / k) * (t + net.exchange_ms(kind, grad, n)) / (base_length * t1)
                    lines.append(
                        f"| {scene} | {k:g} | {rule} | {n} | {target:g} dB | {how}{length:.0f} | {k / n:g} "
                        f"| {t:.3f} ms | {kind} | {mark}{ratio:.3f}x |"
                    )
    return "\n".join(lines) if len(lines) > 2 else "(no sized runs with a step row at k / N of the batch)"


def measured_table(rows: list[dict[str, Any]]) -> str:
    """The prediction checked on real GPUs (experiments ``batch-rule-ddp2`` and ``-ddp4``, read by
    ``readers.ddp_run``): per capture, number of GPUs, rule and exchange, the mean final PSNR and training
    time of each run length (over its seeds), the shortest length that ends at each target
    (:func:`length_to`), the training time to it (interpolated between the lengths around it) and that time
    against one GPU's; also each group's fixed cost (the mean ``fixed_s`` of its runs,
    ``readers.fixed_cost``: what the first steps cost beyond the steady rate, which does not shrink with
    the number of GPUs) and the ratio to one GPU without the fixed costs (what the step-time prediction
    models)."""
    groups: dict[tuple[str, int, str, str], dict[int, list[tuple[float, float]]]] = {}
    costs: dict[tuple[str, int, str, str], list[float]] = {}
    for r in rows:
        if r.get("world") is None or r.get("status", "ok") != "ok":
            continue
        if r.get("psnr") is None or r.get("train_s") is None or r.get("length") is None:
            continue
        key = (str(r.get("scene") or "?"), int(r["world"]), str(r["rule"]), str(r.get("exchange") or "fp32"))
        run = (float(r["psnr"]), float(r["train_s"]))
        groups.setdefault(key, {}).setdefault(int(r["length"]), []).append(run)
        if r.get("fixed_s") is not None:
            costs.setdefault(key, []).append(float(r["fixed_s"]))
    if not groups:
        return "(no runs timed on several GPUs)"
    # each length: the mean final PSNR and training time of its seeds
    means = {
        key: {n: (sum(p for p, _ in v) / len(v), sum(t for _, t in v) / len(v)) for n, v in runs.items()}
        for key, runs in groups.items()
    }

    def to_target(runs: dict[int, tuple[float, float]], target: float) -> tuple[float | None, str]:
        length, how = length_to([(n, p) for n, (p, _) in runs.items()], target)
        if length is None:
            return None, how
        lengths = sorted(runs)  # length_to's length lies within them: interpolation, never extrapolation
        return float(np.interp(length, lengths, [runs[n][1] for n in lengths])), how

    fixed = {key: _mean(costs.get(key, [])) for key in means}
    # one GPU's reading per capture and target: per_device's where there are several (written last)
    ones = sorted((key for key in means if key[1] == 1), key=lambda key: key[2] == "per_device")
    base = {
        (key[0], target): (*to_target(means[key], target), fixed[key])
        for key in ones
        for target in TARGETS.get(key[0], ())
    }
    lines = [
        "| capture | GPUs | rule | exchange | final PSNR / training time by length (reference steps) "
        "| target | training time to it | against 1 GPU | fixed cost | against 1 GPU without it |",
        "| --- | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, runs in sorted(means.items()):
        scene, world, rule, exchange = key
        finals = ", ".join(f"{n / 1000:g}k: {p:.3f} dB / {t:.1f} s" for n, (p, t) in sorted(runs.items()))
        for target in TARGETS.get(scene, ()):
            seconds, how = to_target(runs, target)
            base_s, base_how, base_fixed = base.get((scene, target), (None, "", None))
            ratio = steady = "-"
            if seconds is not None and base_s:
                mark = _bound_mark(how, base_how)
                ratio = f"{mark}{seconds / base_s:.2f}x"
                if fixed[key] is not None and base_fixed is not None:
                    steady = f"{mark}{(seconds - fixed[key]) / (base_s - base_fixed):.2f}x"
            time = how if seconds is None else f"{how}{seconds:.1f} s"
            cost = "-" if fixed[key] is None else f"{fixed[key]:.1f} s"
            lines.append(
                f"| {scene} | {world} | {rule} | {exchange} | {finals} | {target:g} dB | {time} | {ratio} "
                f"| {cost} | {steady} |"
            )
    return "\n".join(lines)


def _mean_finals(runs: Iterable[Curve], key: Any) -> dict[Any, float]:
    """The mean final PSNR of the runs (seeds) under each ``key(run)``."""
    groups: dict[Any, list[float]] = {}
    for c in runs:
        if c.final_psnr is not None:
            groups.setdefault(key(c), []).append(float(c.final_psnr))
    return {k: mean for k, v in groups.items() if (mean := _mean(v)) is not None}


def prediction_tables(preds: list[Prediction], rows: list[dict[str, Any]], gpus: Sequence[int]) -> str:
    """Per capture and target: each rule's time on N GPUs / the 1-GPU time, the winner per N."""
    out = []
    runs = curves(rows)
    finals = _mean_finals(runs, lambda c: (c.scene, c.k, c.rule))
    base_final = _mean_finals([c for c in runs if c.k == 1.0], lambda c: c.scene)
    keys = sorted({(p.scene, p.target) for p in preds}, key=lambda k: (k[0], k[1]))
    for scene, target in keys:
        these = [p for p in preds if (p.scene, p.target) == (scene, target)]
        rules = sorted({(p.rule, p.exchange) for p in these}, key=lambda r: (r[1] != "fp32", r))
        out.append(
            f"**{scene}, {target:g} dB**: predicted time on N GPUs / the 1-GPU time "
            "(`~`: extrapolated in k; PSNR change at the end of the k = N run against k = 1)\n"
        )
        out.append("| rule | exchange | " + " | ".join(f"N = {n}" for n in gpus) + " |")
        out.append("| --- | --- | " + " | ".join("---:" for _ in gpus) + " |")
        for rule, kind in rules:
            cells = []
            for n in gpus:
                p = next((q for q in these if (q.rule, q.exchange, q.n) == (rule, kind, n)), None)
                if p is None or p.ratio is None:
                    cells.append("; ".join(p.notes) if p is not None and p.notes else "-")
                    continue
                cell = ("~" if p.extrapolated_from else "") + f"{p.ratio:.2f}x ({p.seconds:.1f} s)"
                final, base = finals.get((scene, float(n), rule)), base_final.get(scene)
                if rule != "global" and final is not None and base is not None:
                    cell += f", {final - base:+.2f} dB"
                cells.append(cell)
            out.append(f"| {rule} | {kind} | " + " | ".join(cells) + " |")
        for n in gpus:
            best = min(
                (p for p in these if p.n == n and p.ratio is not None), key=lambda p: p.ratio, default=None
            )
            if best is not None:
                out.append(
                    f"\nN = {n}: **{best.rule}** ({best.exchange}) wins, {best.ratio:.2f}x the 1-GPU time"
                    + (
                        f" (extrapolated from k = {best.extrapolated_from:g})"
                        if best.extrapolated_from
                        else ""
                    )
                )
        out.append("")
    return "\n".join(out)


def report(rows: list[dict[str, Any]], gpus: Sequence[int], net: Network) -> tuple[str, list[Prediction]]:
    preds = predict(rows, gpus, net)
    text = "\n\n".join(
        [
            f"Assumptions: ring all-reduce at {net.busbw_gbs:g} GB/s bus bandwidth (H200 NVLink 4: "
            f"450 GB/s per direction), {net.buckets} buckets x {net.latency_us:g} us, casts at "
            f"{net.hbm_gbs:g} GB/s of HBM, no overlap with compute.",
            "A. time per step against rays per step\n\n" + step_table(rows),
            "B. steps to the targets on one GPU with k x the batch\n\n" + curve_table(rows),
            "B, sized: the shortest run that ends at each target\n\n" + sized_table(rows, net),
            "B, sized, split over more GPUs than reference batches\n\n" + split_table(rows, gpus, net),
            "C. the gradient exchange per step\n\n" + exchange_table(rows, gpus, net),
            "Predicted time to the targets\n\n" + prediction_tables(preds, rows, gpus),
            "Measured on several GPUs\n\n" + measured_table(rows),
        ]
    )
    return text, preds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--from", dest="rows", type=Path, required=True, help="the runner's rows.jsonl")
    p.add_argument("--gpus", default="2,4,8", help="numbers of GPUs to predict for")
    p.add_argument("--busbw-gbs", type=float, default=Network.busbw_gbs)
    p.add_argument("--latency-us", type=float, default=Network.latency_us)
    p.add_argument("--buckets", type=int, default=Network.buckets)
    p.add_argument("--hbm-gbs", type=float, default=Network.hbm_gbs)
    p.add_argument("--json", type=Path, default=None, help="also write the predictions here")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not args.rows.is_file():
        print(f"error: --from {args.rows}: no such file", file=sys.stderr)
        return 2
    try:
        gpus = [int(n) for n in args.gpus.split(",") if n.strip()]
        rows = load_rows(args.rows)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    net = Network(args.busbw_gbs, args.latency_us, args.buckets, args.hbm_gbs)
    text, preds = report(rows, gpus, net)
    print(text)
    if not preds and not any(r.get("world") is not None for r in rows):
        print(
            f"error: no step rows with a full-batch step, no curve rows of lego or fox and no runs timed on "
            f"several GPUs in {args.rows}",
            file=sys.stderr,
        )
        return 1
    if args.json:
        args.json.write_text(json.dumps([p.__dict__ for p in preds], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
