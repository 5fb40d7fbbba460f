"""Training and resuming with sharded training views (``data.shard``), through the train app.

Each rank is ``python -m nerf_lightning.train strategy=ddp devices=2`` forked from the test process with
the variables Lightning's launcher gives the processes it starts (gloo on the CPU):

- two ranks with shards, ``B`` rays each per step, against one process with ``2 B`` rays per step, the
  same steps (equal rays seen, ``batch_rule=per_device``: the same learning rate and schedules): the
  mean held-out PSNR of three seeds of the two ranks is no more than 0.3 dB below one process's;
- a checkpoint of two ranks resumes on one process, and one of one process on two ranks: the views are
  sharded again for the new ranks, and the sampler's state and the per-view corrections (poses,
  exposures) are the checkpoint's when training resumes;
- ``data.storage=host`` trains to the PSNR of ``device`` on one process (on the CPU its batches are the
  device's, bit for bit: the same run).
"""

from __future__ import annotations

import json
import socket
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from runs import TINY_TRAIN, child_env, fork_app

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="torch.distributed with gloo"
)

#: a callback (``+callbacks.probe``) that records, when training starts or resumes, what this rank holds
PROBE = textwrap.dedent(
    """
    import copy

    import torch
    import lightning as L

    class Probe(L.Callback):
        def __init__(self, out):
            self.out = out

        def on_train_start(self, trainer, pl_module):
            dm = trainer.datamodule
            per_view = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()
                        if k.startswith(("camera_opt.", "appearance."))}
            torch.save({
                "step": trainer.global_step, "world": trainer.world_size,
                "held": dm.train_pixels.held_views.clone(), "pixels": int(dm.train_pixels.nbytes),
                "sampler": copy.deepcopy(dm.sampler.state_dict()),
                "view_probs": dm.sampler.view_probs.cpu().clone(), "per_view": per_view,
            }, f"{self.out}/probe_w{trainer.world_size}_s{trainer.global_step}_r{trainer.global_rank}.pt")
    """
)


def _port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _train(run: Path, ranks: int, *overrides: str, timeout: float = 600) -> dict[str, float]:
    """The train app on ``ranks`` gloo processes (1: one plain process) into ``run``; its metrics."""
    run.mkdir(parents=True, exist_ok=True)
    (run.parent / "shard_probe.py").write_text(PROBE)
    args = [*overrides, f"hydra.run.dir={run}", "+callbacks.probe._target_=shard_probe.Probe",
            f"+callbacks.probe.out={run}"]  # fmt: skip
    base = {k: v for k, v in child_env().items()
            if not k.startswith(("MASTER_", "LOCAL_RANK", "RANK", "NODE_RANK", "WORLD_SIZE"))}  # fmt: skip
    port = _port()
    envs = [base] if ranks == 1 else [
        {**base, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": str(ranks),
         "NODE_RANK": "0", "LOCAL_RANK": str(r)}
        for r in range(ranks)
    ]  # fmt: skip
    if ranks > 1:
        args = ["strategy=ddp", f"devices={ranks}", *args]
    logs = [run / f"rank{r}.out" for r in range(ranks)]
    procs = [
        fork_app("train", *args, cwd=run.parent, log=logs[r], env=envs[r], path=[str(run.parent)])
        for r in range(ranks)
    ]
    try:
        for p in procs:
            p.join(timeout=timeout)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * ranks, "\n".join(log.read_text()[-4000:] for log in logs)
    return json.loads((run / "metrics.json").read_text())


def _flat(state: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    """A state dict's tensors by dotted key (the sampler keeps a dict of its own inside)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = torch.as_tensor(value).cpu()
    return out


def _probes(run: Path, world: int, step: int) -> list[dict]:
    return [torch.load(run / f"probe_w{world}_s{step}_r{r}.pt") for r in range(world)]


# ------------------------------------------------------------------------------------ equal PSNR
PSNR_STEPS, RAYS = 300, 256
PSNR_RUN = [
    *TINY_TRAIN,
    "batch_rule=per_device",
    f"trainer.max_steps={PSNR_STEPS}",
    "data.steps_per_epoch=100",
    "callbacks.model_checkpoint=null",
    "model.save_val_images=false",
]


#: every training ray is over a random background colour, so one 300-step run's PSNR moves with its seed:
#: one process at seeds 42, 1, 2, 3 gave 21.60, 22.24, 21.85, 21.56 dB (2 busy cores, 2026-12-07), a
#: spread a single pair of runs cannot be compared within 0.3 dB; the means of three seeds can. Two ranks
#: drawing a quarter of their rays (half the rays one process sees) fell 0.38 dB below it
PSNR_SEEDS = (42, 1, 2)
MAX_MEAN_LOSS_DB = 0.3


@pytest.mark.repro
def test_two_sharded_ranks_reach_the_psnr_of_one_process(tiny_scene: Path, tmp_path: Path) -> None:
    data = f"data.path={tiny_scene}"
    ones, twos = [], []
    for seed in PSNR_SEEDS:
        run = tmp_path / f"seed{seed}"
        common = [*PSNR_RUN, data, f"seed={seed}"]
        ones.append(_train(run / "one", 1, *common, f"data.batch_size={2 * RAYS}"))
        twos.append(_train(run / "two", 2, *common, f"data.batch_size={RAYS}", "data.shard=true"))
    first = tmp_path / f"seed{PSNR_SEEDS[0]}"
    (r0, r1), (whole,) = _probes(first / "two", 2, 0), _probes(first / "one", 1, 0)
    n_train = len(whole["held"])  # 21 views of one size: 11 on rank 0, 10 on rank 1
    assert sorted(torch.cat([r0["held"], r1["held"]]).tolist()) == list(range(n_train))  # disjoint
    assert (r0["pixels"], r1["pixels"]) == (whole["pixels"] * 11 // 21, whole["pixels"] * 10 // 21)
    assert {run["steps"] for run in ones + twos} == {PSNR_STEPS}
    one_psnr, two_psnr = [run["val/psnr"] for run in ones], [run["val/psnr"] for run in twos]
    assert min(one_psnr) > 17.0, one_psnr  # it trained (untrained: about 11 dB)
    # measured on 2 busy cores (2026-12-07): one process 21.60, 22.24, 21.85 dB (mean 21.90), two ranks
    # 22.01, 22.47, 21.61 dB (mean 22.03); with a quarter of the rays per rank 21.51, 21.64, 21.42 dB
    gap = sum(two_psnr) / len(two_psnr) - sum(one_psnr) / len(one_psnr)
    assert gap > -MAX_MEAN_LOSS_DB, (one_psnr, two_psnr)


# ------------------------------------------------------------------------------- another world
RESUME_RUN = [
    *TINY_TRAIN,
    "data.batch_size=128",
    "batch_rule=per_device",  # optimizer steps = trainer.max_steps on any number of ranks
    "data.sampler=loss_weighted",
    "data.samplers.loss_weighted.warmup_steps=2",
    "data.samplers.loss_weighted.update_every=2",
    "model.net.camera_opt.enabled=true",
    "model.net.appearance.enabled=true",
    "model.net.appearance.bias=true",
    "model.heldout_fit.enabled=false",  # what is resumed, not the final evaluation's fit of its views
    "model.save_val_images=false",
    "trainer.check_val_every_n_epoch=1000",
]
FIRST, SECOND = 8, 12


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_on_another_number_of_ranks(
    tiny_scene: Path, tmp_path: Path, before: int, after: int
) -> None:
    run = tmp_path / "run"
    args = [*RESUME_RUN, f"data.path={tiny_scene}"]
    _train(run, before, *args, f"trainer.max_steps={FIRST}")
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == FIRST
    _train(run, after, *args, f"trainer.max_steps={SECOND}", "ckpt_path=last")
    first, resumed = _probes(run, before, 0), _probes(run, after, FIRST)
    n_train = len(torch.cat([p["held"] for p in first]))
    # re-sharded: each of the new ranks holds its own part, together every training view once
    held = torch.cat([p["held"] for p in resumed])
    assert sorted(held.tolist()) == list(range(n_train))
    total, per_view = sum(p["pixels"] for p in first), sum(p["pixels"] for p in first) // n_train
    assert sum(p["pixels"] for p in resumed) == total  # 21 views of equal size: 11 and 10 on two ranks
    assert [p["pixels"] // per_view for p in resumed] in ([n_train], [(n_train + 1) // 2, n_train // 2])
    # the sampler's state and the per-view corrections are the checkpoint's, on every new rank
    (state,) = [v for k, v in ckpt.items() if k.endswith("DataModule")]
    saved = _flat(state["sampler"])
    assert any("acc" in key for key in saved), saved.keys()  # the loss statistics are part of it
    assert float(saved["view_probs"].max() - saved["view_probs"].min()) > 1e-4  # moved off uniform
    per_view = ("camera_opt.", "appearance.")
    corrections = {k: v for k, v in ckpt["state_dict"].items() if k.startswith(per_view)}
    assert float(corrections["camera_opt.adjustment"].abs().max()) > 0  # they were trained
    assert float(corrections["appearance.log_gain"].abs().max()) > 0
    for p in resumed:
        mine = _flat(p["sampler"])
        assert mine.keys() == saved.keys()
        for key, value in saved.items():
            assert torch.equal(mine[key], value), key
        assert p["per_view"].keys() == corrections.keys()
        for key, value in corrections.items():
            assert torch.equal(p["per_view"][key], value.cpu()), key
    assert json.loads((run / "metrics.json").read_text())["steps"] == SECOND


# --------------------------------------------------------------------------------- host storage
def test_host_storage_trains_to_the_psnr_of_device_storage(tiny_scene: Path, tmp_path: Path) -> None:
    args = [*TINY_TRAIN, f"data.path={tiny_scene}", "trainer.max_steps=60", "callbacks.model_checkpoint=null",
            "model.save_val_images=false"]  # fmt: skip
    device = _train(tmp_path / "device", 1, *args, "data.storage=device")
    host = _train(tmp_path / "host", 1, *args, "data.storage=host")
    assert device["val/psnr"] > 13.0, device  # it trained (untrained: about 11 dB)
    assert host["val/psnr"] == device["val/psnr"]  # the same batches: the same run
    assert "data.storage=host: host" in (tmp_path / "host" / "rank0.out").read_text()
