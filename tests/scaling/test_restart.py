"""A job that restarts itself: torchrun ``--max-restarts=1``, one rank killed with SIGKILL mid-run.

One node, two CPU ranks (gloo), ``resume=auto`` and a run folder named after the rendezvous id (what
the Kubernetes manifests and the SLURM script do with their job ids). Once the first ``last.ckpt``
exists, rank 1 is killed; torchrun stops the group and starts it again. The restarted group finds the
run folder free (the dead rank 0's lock went with its process), continues from the checkpoint instead of
step 0 and finishes: exit status 0, one run folder, the step count of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from nerf_lightning.run.checkpoint_io import read_checkpoint

from .conftest import TINY_RUN, free_port
from .test_torchrun import _agent_main, _children, _kill_node

pytestmark = [
    pytest.mark.repro,
    # Seen on 2026-12-05 (2-core CPU, torch's gloo): the lock lets the restarted group in and it resumes
    # from last.ckpt, but its rank 1 fails in gloo's connectFullMesh ("Connection refused" to a stale
    # address of rank 0): the job then exits 1. Strict: remove the mark once the restart passes.
    pytest.mark.xfail(strict=True, reason="restarted gloo group: rank 1 cannot connect to the new rank 0"),
    pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc to find torchrun's workers"),
]

STEPS, EVERY = 24, 8


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def test_a_killed_rank_restarts_the_group_from_its_checkpoint(tiny_scene: Path, tmp_path: Path) -> None:
    import multiprocessing as mp

    from .conftest import clean_env

    port = free_port()
    argv = [
        "--nnodes=1", "--nproc-per-node=2", "--max-restarts=1", "--monitor-interval=0.5",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=job51",
        "-m", "nerf_lightning.train", "strategy=ddp", "devices=2", "resume=auto", f"data.path={tiny_scene}",
        f"trainer.max_steps={STEPS}", f"callbacks.last_checkpoint.every_n_train_steps={EVERY}",
        "trainer.log_every_n_steps=4", *TINY_RUN,
    ]  # fmt: skip
    log = tmp_path / "agent.log"
    agent = mp.get_context("fork").Process(
        target=_agent_main, args=(argv, str(tmp_path), str(log), clean_env())
    )
    agent.start()
    run = tmp_path / "outputs" / "runs" / "train" / "torchrun-job51"
    try:
        deadline = time.monotonic() + 240
        killed = None
        while killed is None and time.monotonic() < deadline and agent.is_alive():
            last = run / "checkpoints" / "last.ckpt"
            if last.is_file():
                try:
                    step = int(read_checkpoint(last)["global_step"])
                except Exception:  # noqa: BLE001 - being written
                    step = None
                if step is not None:
                    for pid in _children(agent.pid):
                        if _rank_of(pid) == 1:
                            os.kill(pid, signal.SIGKILL)
                            killed = step
            time.sleep(0.05)
        assert killed is not None, log.read_text()[-3000:]
        agent.join(timeout=300)
        code = agent.exitcode
    finally:
        _kill_node(agent)
    text = log.read_text()
    assert code == 0, text[-4000:]
    assert [p.name for p in run.parent.iterdir()] == ["torchrun-job51"]  # one run folder
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["steps"] == STEPS / 2  # optimizer steps of large_batch on 2 ranks, as uninterrupted
    assert f"resuming from {run / 'checkpoints' / 'last.ckpt'}" in (run / "train.log").read_text()
    assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == STEPS / 2
    assert metrics["val/psnr"] > 12.0, metrics
