"""One run directory per job, whatever launched its processes.

Hydra picks the run directory (``hydra.run.dir``) in each process before the app starts. Lightning's
own DDP launcher passes the parent's directory to the processes it spawns, but processes started by
``torchrun`` on several nodes, or by ``srun`` as SLURM tasks, each resolve the config themselves: a
directory named after the clock could differ between ranks (and after a SLURM requeue, the job
would not find its own checkpoints). The config therefore names the run after an id that every
process of one job shares, read from the launcher's environment by the ``nerf_lightning.run_id``
resolver:

1. ``NERF_LIGHTNING_RUN_ID``: set it yourself (Kubernetes manifests, custom launchers);
2. ``SLURM_JOB_ID`` (``slurm-<id>``; array tasks ``slurm-<array job>_<task>``): the same for every
   task of the job and kept across requeues, so a requeued job resumes from its own checkpoints;
3. ``TORCHELASTIC_RUN_ID`` (``torchrun-<rdzv id>``): torchrun's ``--rdzv-id``, shared by all nodes
   (``--standalone`` and single-node runs get a fresh UUID); the default ``none`` is not an id;
4. otherwise the fallback argument (the launch time in ``conf/hydra/default.yaml``).

``nerf_lightning.rank_zero_only`` and ``nerf_lightning.rank_suffix`` keep the ranks that share a
directory from writing the same files: only rank 0 saves ``.hydra/``, and every other rank logs to
``<task>_rank<r>.log``.
"""

from __future__ import annotations

import os
import re

from omegaconf import OmegaConf

RUN_ID_ENV = "NERF_LIGHTNING_RUN_ID"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _safe(text: str) -> str:
    return _UNSAFE.sub("-", text).strip("-.") or "run"


def run_id(fallback: str) -> str:
    """The run's id shared by all of its processes (see the module docstring), else ``fallback``."""
    explicit = os.environ.get(RUN_ID_ENV, "").strip()
    if explicit:
        return _safe(explicit)
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job and os.environ.get("SLURM_ARRAY_TASK_ID"):
        return f"slurm-{_safe(array_job)}_{_safe(os.environ['SLURM_ARRAY_TASK_ID'])}"
    if os.environ.get("SLURM_JOB_ID"):
        return f"slurm-{_safe(os.environ['SLURM_JOB_ID'])}"
    elastic = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if elastic and elastic != "none":
        return f"torchrun-{_safe(elastic)}"
    return fallback


def rank_tag() -> str | None:
    """``None`` for the job's rank-0 process, else a tag naming this process, from its launcher's variables.

    ``RANK`` (torchrun, Kubeflow) or ``SLURM_PROCID`` (srun tasks) give ``rank<r>``; processes of
    Lightning's own launcher (``NODE_RANK``, ``LOCAL_RANK``; their global rank is not known before the
    Trainer exists) give ``node<n>_local<l>``. A process launched alone is rank 0.
    """
    for key in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(key, "").strip()
        if value.isdigit():
            return None if int(value) == 0 else f"rank{int(value)}"
    node, local = (os.environ.get(k, "0").strip() for k in ("NODE_RANK", "LOCAL_RANK"))
    node_i, local_i = (int(v) if v.isdigit() else 0 for v in (node, local))
    return None if node_i == local_i == 0 else f"node{node_i}_local{local_i}"


def rank_zero_only(value: str) -> str | None:
    """``value`` on rank 0, ``None`` on every other rank (e.g. ``hydra.output_subdir``)."""
    return value if rank_tag() is None else None


def rank_suffix() -> str:
    """``""`` on rank 0, ``_<rank tag>`` elsewhere (per-rank log file names in a shared run directory)."""
    tag = rank_tag()
    return "" if tag is None else f"_{tag}"


def _auto_precision(accelerator: str = "auto") -> str:
    from nerf_lightning.utils.precision import resolve_precision

    return resolve_precision("auto", str(accelerator))


def register_resolvers() -> None:
    """Register the ``nerf_lightning.*`` resolvers the config uses (idempotent)."""
    for name, fn in (
        ("nerf_lightning.run_id", run_id),
        ("nerf_lightning.rank_zero_only", rank_zero_only),
        ("nerf_lightning.rank_suffix", rank_suffix),
        ("nerf_lightning.auto_precision", _auto_precision),
    ):
        if not OmegaConf.has_resolver(name):
            # cached: every interpolation of one config sees the same value
            OmegaConf.register_new_resolver(name, fn, use_cache=True)
