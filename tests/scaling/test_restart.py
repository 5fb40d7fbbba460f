"""A job that restarts itself: torchrun ``--max-restarts=1``, one rank killed with SIGKILL mid-run.

One node, two CPU ranks (gloo), ``resume=auto`` and a run folder named after the rendezvous id (what
the Kubernetes manifests and the SLURM script do with their job ids). Once the first ``last.ckpt``
exists, rank 1 is killed; torchrun stops the group and starts it again. The restarted group finds the
run folder free (the dead rank 0's lock went with its process), continues from the checkpoint instead of
step 0 and finishes: exit status 0, one run folder, the step count and, within noise, the PSNR of an
uninterrupted run of the same job.

The agent runs with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, as ``docs/scaling.md`` tells: by default
torchrun's c10d rendezvous hands every attempt of the worker group the same store, holding the killed
attempt's gloo addresses, and a restarted rank that reads one before its peer has replaced it fails in
gloo's ``connectFullMesh`` ("Connection refused") or hangs in its setup (pytorch/pytorch#135712: 3 of
5 runs here without the variable).
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
    pytest.mark.slow,
    pytest.mark.repro,  # a torchrun group trained twice (about 35 s): make test-repro, as CI runs it
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


#: torchrun's agent environment for restarts (the fix of pytorch/pytorch#135712: see the docstring)
AGENT_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
#: the restarted run's held-out PSNR may differ from the uninterrupted one's by this much (dB): the
#: steps after the checkpoint are run again from it, in another order of gloo's reductions
PSNR_NOISE_DB = 0.3


def _torchrun(cwd: Path, rdzv_id: str, env: dict[str, str]):  # noqa: ANN202 - (process, run folder, log)
    import multiprocessing as mp

    argv = [
        "--nnodes=1", "--nproc-per-node=2", "--max-restarts=1", "--monitor-interval=0.5",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id={rdzv_id}",
        "-m", "nerf_lightning.train", "strategy=ddp", "devices=2", "resume=auto",
        f"data.path={cwd.parent / 'scene'}",
        f"trainer.max_steps={STEPS}", f"callbacks.last_checkpoint.every_n_train_steps={EVERY}",
        "trainer.log_every_n_steps=4", *TINY_RUN,
    ]  # fmt: skip
    cwd.mkdir(parents=True, exist_ok=True)
    log = cwd / "agent.log"
    agent = mp.get_context("fork").Process(target=_agent_main, args=(argv, str(cwd), str(log), env))
    agent.start()
    return agent, cwd / "outputs" / "runs" / "train" / f"torchrun-{rdzv_id}", log


@pytest.fixture(scope="module")
def restarted(tiny_scene: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str, dict]:
    """The job with rank 1 killed once the first ``last.ckpt`` exists: (run folder, the checkpoint's step
    at the kill, the agent's log, metrics.json)."""
    import shutil

    from .conftest import clean_env

    tmp_path = tmp_path_factory.mktemp("restart")
    shutil.copytree(tiny_scene, tmp_path / "scene")
    agent, run, log = _torchrun(tmp_path / "restarted", "job51", clean_env(**AGENT_ENV))
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
    return run, killed, text, json.loads((run / "metrics.json").read_text())


def test_a_killed_rank_restarts_the_group_from_its_checkpoint(restarted) -> None:
    run, killed, _, metrics = restarted
    assert [p.name for p in run.parent.iterdir()] == ["torchrun-job51"]  # one run folder
    train_log = (run / "train.log").read_text()
    # two attempts in one log; the second continues from the checkpoint's step, not from step 0
    assert train_log.count("batch_rule=large_batch: 12 optimizer steps") == 2, train_log
    assert f"resuming from {run / 'checkpoints' / 'last.ckpt'}" in train_log
    assert "pytorch/pytorch#135712" not in train_log  # the agent has the fix: no warning
    assert f"resume: finishing step {killed} " in train_log, train_log
    assert metrics["steps"] == STEPS / 2  # optimizer steps of large_batch on 2 ranks, as uninterrupted
    assert read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"] == STEPS / 2
    # the first attempt's training time is counted in: the run was continued, not started again
    assert metrics["time/train_s"] > metrics["time/train_s_this_process"], metrics


@pytest.mark.repro  # a second two-rank run of the job: make test-repro
def test_the_restarted_job_reaches_the_psnr_of_an_uninterrupted_one(restarted) -> None:
    from .conftest import clean_env

    run, _, _, metrics = restarted
    agent, ref_run, ref_log = _torchrun(run.parents[4] / "uninterrupted", "job51", clean_env(**AGENT_ENV))
    try:
        agent.join(timeout=300)
    finally:
        _kill_node(agent)
    assert agent.exitcode == 0, ref_log.read_text()[-3000:]
    reference = json.loads((ref_run / "metrics.json").read_text())
    assert reference["steps"] == metrics["steps"]
    assert abs(metrics["val/psnr"] - reference["val/psnr"]) <= PSNR_NOISE_DB, (metrics, reference)
    print(f"PSNR restarted {metrics['val/psnr']:.3f} dB, uninterrupted {reference['val/psnr']:.3f} dB")
