"""The pieces of a benchmark experiment: jobs (one command each, time-boxed) and the builders that write them.

A :class:`Job` is one command line with a time box: a training run, a ``bench.curve`` run, a pytest run, any
module or shell command. It runs **alone** on the machine (``lane=None``: its speed is a number we report)
or in a **lane** (``lane=k``): consecutive lane jobs of an experiment run as parallel queues, one per lane
number, sharing the GPU. Lanes are for fixed-step quality A/Bs, whose PSNR does not depend on the sharing;
their speed does, so the runner reports no speed ratio for them.

Command lines hold placeholders that the runner fills in: ``{python}`` (the interpreter running the
suite), ``{data}`` (the folder holding ``lego``, ``fox``, ``fruit``), ``{work}`` (the runs' folder),
``{exp_dir}`` (this experiment's folder under it) and ``{run_dir}`` (this job's folder).

The builders below write the common jobs; :mod:`benchmarks.experiments` composes them into the
named experiments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks import readers

#: reads a finished job's results: (its run folder, its log) -> rows (:mod:`benchmarks.readers`)
Reader = Callable[[Path, Path], list[dict[str, Any]]]


@dataclass(frozen=True)
class Job:
    """One command of an experiment (see the module docstring)."""

    name: str
    argv: tuple[str, ...]
    read: Reader = readers.nothing
    expected_s: float = 60.0  # a typical duration: the job is skipped when less time than this is left
    timeout_s: float = 120.0  # hard time box: SIGTERM, SIGKILL 10 s later (Lightning traps SIGTERM)
    lane: int | None = None  # None: alone on the machine; k: in lane k, sharing the GPU
    baseline: str | None = None  # the job of the same experiment its PSNR change and speed ratio are against
    ratio_of: str = "steps_per_s"  # the row key the speed ratio divides (higher is better)
    gpus: int = 1  # GPUs it needs (0: runs on a CPU)
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Experiment:
    """A named list of jobs; ``data`` names the captures under ``{data}`` that it needs."""

    name: str
    summary: str
    jobs: tuple[Job, ...]
    data: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        names = [j.name for j in self.jobs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"experiment {self.name}: duplicate job names {dupes}")
        missing = sorted({j.baseline for j in self.jobs if j.baseline and j.baseline not in names})
        if missing:
            raise ValueError(f"experiment {self.name}: baselines {missing} are not jobs of it")

    @property
    def gpus(self) -> int:
        return max((j.gpus for j in self.jobs), default=0)

    def expected_s(self) -> float:
        """Seconds when nothing is skipped: alone jobs add up, a block of lanes lasts its longest lane."""
        total = 0.0
        for block in phases(self.jobs):
            lanes: dict[int | None, float] = {}
            for job in block:
                lanes[job.lane] = lanes.get(job.lane, 0.0) + job.expected_s
            total += max(lanes.values())
        return total


def phases(jobs: Sequence[Job]) -> list[list[Job]]:
    """Consecutive lane jobs form one block (run side by side); every alone job is a block of its own."""
    out: list[list[Job]] = []
    for job in jobs:
        if job.lane is not None and out and out[-1][0].lane is not None:
            out[-1].append(job)
        else:
            out.append([job])
    return out


def in_lanes(jobs: Iterable[Job], n: int = 3) -> tuple[Job, ...]:
    """The jobs spread over ``n`` lanes, each to the lane with the least expected time so far (in order, so
    the paired jobs of one seed run at about the same time)."""
    load = [0.0] * n
    out = []
    for job in jobs:
        k = min(range(n), key=lambda i: load[i])
        load[k] += job.expected_s
        out.append(replace(job, lane=k))
    return tuple(out)


# ------------------------------------------------------------------------------------------ training runs
#: Every fixed-step training run: CSV logs, no progress bar, no validation or checkpoints during training
#: (the final evaluation still runs); the run's metrics.json holds what the tables report.
QUIET = (
    "logger=csv",
    "callbacks.progress_bar=null",
    "trainer.check_val_every_n_epoch=100000",
    "callbacks.model_checkpoint=null",
    "callbacks.last_checkpoint=null",
)
#: The captures, as the training command takes them.
SCENES: dict[str, tuple[str, ...]] = {
    "lego": ("experiment=blender", "data.path={data}/lego"),
    "fox": ("data.path={data}/fox",),
    "fruit": ("data.path={data}/fruit",),
    "default": (),  # the generated default scene (what `make train` trains)
}
#: Training steps/s of one H200 alone (bf16-mixed) and the seconds around training (start-up, data, the
#: graph capture, the final evaluation): what the time boxes are sized from.
_RATE = {"lego": 370.0, "fox": 330.0, "fruit": 260.0, "default": 280.0}
_OVERHEAD = {"lego": 25.0, "fox": 40.0, "fruit": 25.0, "default": 40.0}
#: A job in one of three lanes trains at about this fraction of its rate alone.
_SHARED = 0.4


def cost(scene: str, steps: int, shared: bool = True) -> tuple[float, float]:
    """(expected, timeout) seconds of a ``steps``-step training run on ``scene`` on one H200."""
    rate = _RATE[scene] * (_SHARED if shared else 1.0)
    expected = math.ceil(steps / rate + _OVERHEAD[scene])
    return float(expected), float(math.ceil(1.5 * expected + 20))


def train(
    name: str,
    scene: str,
    *overrides: str,
    steps: int | None = None,
    seed: int | None = None,
    quiet: bool = True,
    shared: bool = True,
    **job: Any,
) -> Job:
    """``python -m nerf_lightning.train`` on ``scene`` with ``overrides``; time box from :func:`cost`
    (``shared``: sized for a lane) unless ``expected_s`` / ``timeout_s`` are given; read by
    ``readers.metrics_json`` unless ``read`` is given."""
    args = [*(QUIET if quiet else ()), *SCENES[scene], *overrides]
    if steps is not None:
        args.append(f"trainer.max_steps={steps}")
    if seed is not None:
        args.append(f"seed={seed}")
    expected, timeout = cost(scene, steps or 20000, shared)
    job.setdefault("expected_s", expected)
    job.setdefault("timeout_s", timeout)
    job.setdefault("read", readers.metrics_json)
    return Job(name, ("{python}", "-m", "nerf_lightning.train", *args, "hydra.run.dir={run_dir}"), **job)


def ab(
    scene: str,
    variants: Mapping[str, Sequence[str]],
    seeds: Sequence[int],
    steps: int,
    baseline: str | None = "default",
    **job: Any,
) -> list[Job]:
    """Each variant (name -> overrides) at each seed, seed by seed; every job is paired with the
    ``baseline`` variant at its seed. Job names: ``<scene>_<variant>_s<seed>``."""
    out = []
    for seed in seeds:
        for variant, overrides in variants.items():
            base = None if baseline is None or variant == baseline else f"{scene}_{baseline}_s{seed}"
            name = f"{scene}_{variant}_s{seed}"
            out.append(train(name, scene, *overrides, steps=steps, seed=seed, baseline=base, **job))
    return out


def curve(
    name: str, scene: str, checkpoints: Sequence[float], rate: float, *overrides: str, **job: Any
) -> Job:
    """``python -m nerf_lightning.bench.curve`` (held-out PSNR after each checkpoint's seconds of training,
    one run per checkpoint), alone on the GPU; one row per checkpoint."""
    ckpts = ",".join(f"{c:g}" for c in checkpoints)
    argv = (
        "{python}", "-m", "nerf_lightning.bench.curve", "--checkpoints", ckpts, "--rate", f"{rate:g}",
        "--tolerance", "1", "--out", "{run_dir}", "--", *SCENES[scene], "logger=csv", *overrides,
    )  # fmt: skip
    expected = sum(checkpoints) + 35.0 * len(checkpoints)
    job.setdefault("expected_s", expected)
    job.setdefault("timeout_s", expected * 1.2 + 40)
    return Job(name, argv, read=readers.curve_json, **job)


def peers(name: str, scene: str, programs: str, times: Sequence[float], *args: str, **job: Any) -> Job:
    """``python -m benchmarks.peers`` (instant-ngp and/or this project at ``times`` seconds of
    training, alone on the GPU, the same views), results under ``{exp_dir}`` so the experiment's jobs
    share its split files and each other's results; one row per program and time point. ``args``: more
    of its options, then ``--`` and training overrides."""
    argv = (
        "{python}", "-m", "benchmarks.peers", "--scene", scene, "--data", "{data}",
        "--out", "{exp_dir}", "--times", ",".join(f"{t:g}" for t in times), "--programs", programs,
        "--json", "{run_dir}/peers.json", *args,
    )  # fmt: skip
    per_point = _OVERHEAD.get(scene, 40.0) + 5.0  # start-up, loading, the evaluation
    expected = sum(times) + per_point * len(times) + 10.0  # + the split files
    job.setdefault("expected_s", expected)
    job.setdefault("timeout_s", expected * 1.5 + 60)
    return Job(name, argv, read=readers.peers_json, **job)


def pytest(name: str, *args: str, **job: Any) -> Job:
    """``python -m pytest -q ARGS``; one row with the pass/fail counts."""
    argv = ("{python}", "-m", "pytest", "-q", "-p", "no:cacheprovider", *args)
    return Job(name, argv, read=readers.pytest_summary, **job)


def module(name: str, module: str, *args: str, read: Reader = readers.nothing, **job: Any) -> Job:
    """``python -m MODULE ARGS``: any entry point of the project (an app, a bench module)."""
    return Job(name, ("{python}", "-m", module, *args), read=read, **job)


def command(name: str, *argv: str, read: Reader = readers.nothing, **job: Any) -> Job:
    """Any command line (a shell script, another project's driver)."""
    return Job(name, tuple(argv), read=read, **job)
