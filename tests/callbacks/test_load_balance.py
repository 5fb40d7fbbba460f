"""The load balancer under DDP: a rank slowed in proportion to its work gets less of it.

A real two-process gloo run of ``python -m nerf_lightning.train strategy=ddp devices=2`` in which
rank 1 computes each ray at half speed (a GPU half as fast, whatever the machine). The two ranks are
forked from the test process (no interpreter start-up) with the variables Lightning's launcher gives
the processes it starts (``MASTER_ADDR``/``MASTER_PORT``, ``WORLD_SIZE``, ``NODE_RANK``, ``LOCAL_RANK``)
and each runs the entry point's ``main()``. The first window measures the imbalance of an even split;
with ``batch_rule=throughput`` the last windows' forward times must agree within 20 %.
"""

from __future__ import annotations

import json
import socket
import textwrap
from pathlib import Path

import pytest
import torch
from runs import child_env, fork_app

from nerf_lightning.callbacks.load_balance import LoadBalancer
from nerf_lightning.data.synthetic import generate_scene
from nerf_lightning.training.batch_rules import throughput
from nerf_lightning.training.clock import TrainingClock
from nerf_lightning.training.feedback import TrainingFeedback

STEPS = 96
WINDOW = 12  # optimizer steps per load-balancing window

SLOW_RANK = textwrap.dedent(
    """
    import time
    import lightning as L

    class SlowRank(L.Callback):
        # Work that costs 1.6 ms per ray on rank 0 and 3.2 ms on rank 1 (a GPU half as fast),
        # larger than the real compute of these tiny steps (also on a busy host, and in the first
        # window, before the occupancy grid is pruned), so the test does not depend on the host.
        # (At a quarter of these costs the first window's lag fell under 1.4x on a host busy with
        # other jobs; at half, the balanced windows' 1.01x became 1.20-1.23x there.)
        def on_train_batch_start(self, trainer, pl_module, *args):
            per_ray = 1.6e-3 * (1 + trainer.global_rank)
            time.sleep(per_ray * trainer.datamodule.rays_per_step())
    """
)


def test_shares_move_towards_equal_forward_times() -> None:
    class _Trainer:
        world_size, global_rank, is_global_zero, global_step, loggers = 2, 1, False, 50, []

    class _Module:
        share = None

        def set_work_scale(self, s: float) -> None:
            self.share = s

    feedback = TrainingFeedback(TrainingClock(throughput()))
    lb = LoadBalancer(momentum=0.0, feedback=feedback)  # undamped: the whole correction in one window
    module = _Module()
    # even shares; rank 1 needs 3 s for 10 steps, rank 0 1 s: shares ~ 1 / time, renormalized
    lb._update(_Trainer(), module, torch.tensor([[1.0, 10, 1.0], [3.0, 10, 1.0]], dtype=torch.float64))
    assert lb.imbalance == pytest.approx(3.0)
    assert module.share == pytest.approx(2 * (2 / 3) / (2 + 2 / 3))  # = 0.5
    assert lb.summary()["perf/forward_imbalance_first"] == pytest.approx(3.0)


@pytest.mark.slow
@pytest.mark.timing  # forward times against sleeps: meaningful on an idle machine (make test-timing)
def test_throughput_scaling_evens_out_a_slow_rank(tmp_path: Path) -> None:
    scene = tmp_path / "scene"
    generate_scene(scene, n_views=8, width=24, height=24, supersample=1)
    (tmp_path / "slow_rank.py").write_text(SLOW_RANK)
    run = tmp_path / "run"
    args = [
        "strategy=ddp", "devices=2", "accelerator=cpu", "experiment=cpu", "logger=none",
        f"data.path={scene}", "data.batch_size=64", "batch_rule=throughput",
        f"data.steps_per_epoch={STEPS}", f"trainer.max_steps={STEPS}", "trainer.check_val_every_n_epoch=1000",
        "model.net.renderer.occupancy.resolution=16", "model.net.field.encoding.n_levels=4",
        "model.net.field.encoding.max_resolution=64",
        "model.net.renderer.step_size=0.06", "model.net.renderer.max_samples_per_ray=24",
        "model.net.renderer.occupancy.warmup_steps=4",
        "callbacks.progress_bar=null", "callbacks.model_checkpoint=null",
        f"callbacks.load_balance.every_n_steps={WINDOW}",
        "+callbacks.slow._target_=slow_rank.SlowRank", f"hydra.run.dir={run}",
    ]  # fmt: skip
    base = {
        k: v for k, v in child_env().items()
        if not k.startswith(("WANDB_", "MASTER_", "LOCAL_RANK", "RANK", "NODE_RANK", "WORLD_SIZE"))
    }  # fmt: skip
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    ranks = [
        fork_app("train", *args, cwd=tmp_path, log=logs[r], path=[str(tmp_path)],
                 env={**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2",
                      "NODE_RANK": "0", "LOCAL_RANK": str(r)})
        for r in range(2)
    ]  # fmt: skip
    try:
        for p in ranks:
            p.join(timeout=300)
    finally:
        for p in ranks:
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in ranks] == [0, 0], "\n".join(log.read_text()[-3000:] for log in logs)
    assert (run / "train_node0_local1.log").is_file()  # rank 1 ran in the shared run folder
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["steps"] == STEPS
    # an even split: rank 1 lags (2x by construction; 1.40-1.9x measured, the least on a host busy with
    # two other test processes), well clear of the balanced bound below
    assert metrics["perf/forward_imbalance_first"] > 1.3, metrics
    assert metrics["perf/forward_imbalance"] <= 1.2, metrics
