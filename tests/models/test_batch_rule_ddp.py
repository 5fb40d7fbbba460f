"""A batch rule in rays on two gloo ranks against one process drawing their batch (a rule with
``rank_multiple=2``) and one process with the reference batch: the learning rate, the occupancy updates
and the sampler's windows follow the same schedule over the rays seen; the ranks stay identical, also
with the gradients exchanged in bfloat16, which moves the held-out PSNR of the short run by a little
(measured on a 2-core AMD EPYC with avx2 kernels: 13.522 dB with float32 gradients, 13.654 dB with
bfloat16 ones, from 10.964 dB untrained).

The ranks run the default rule, ``auto``, which on two ranks is ``large_batch`` (per-device batches,
schedules in rays, lr x k after a warm-up); the one process with their batch names ``large_batch``
(``auto`` on one process is ``per_device``), the one with the reference batch runs ``auto``
(``tests/training/test_clock.py`` has the rules' arithmetic).
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.distributed as dist

from nerf_lightning.callbacks.grad_exchange import GradientExchange
from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.sampler import LossWeightedRaySampler
from nerf_lightning.data.synthetic import generate_scene
from nerf_lightning.models.field import NGPField
from nerf_lightning.models.module import NeRFModule
from nerf_lightning.training import batch_rules
from nerf_lightning.training.clock import TrainingClock
from nerf_lightning.training.feedback import TrainingFeedback
from nerf_lightning.training.lr_schedules import ngp_exponential_decay
from nerf_lightning.volume.occupancy import OccupancyGrid
from nerf_lightning.volume.renderer import build_renderer
from tests.nerf_modules import nerf_module

RULE = "auto"  # what strategy=ddp trains with by default
SEVERAL = "large_batch"  # what auto is on several ranks
DECAY = functools.partial(ngp_exponential_decay, decay_start=0.5, decay_interval=0.25, decay_base=0.1)
REFERENCE_STEPS = 128  # trainer.max_steps: reference steps of 64 rays
WARMUP = 4  # the rule's lr_warmup, reference steps
BATCH = 64


class _Record(L.Callback):
    """Per optimizer step: the learning rate it runs with and its clock position; every occupancy update
    (step, the position it was given) and every sampler window (step). Saved per rank at the end."""

    def __init__(self, out: Path, tag: str) -> None:
        self.out, self.tag = out, tag
        self.lrs: list[float] = []
        self.positions: list[float] = []
        self.updates: list[tuple[int, float]] = []
        self.windows: list[int] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.lr_lambda = trainer.lr_scheduler_configs[0].scheduler.lr_lambdas[0].__qualname__
        grid, sampler = pl_module.occupancy, trainer.datamodule.sampler
        update, fold = grid.update, sampler._fold

        def recorded_update(step: float, *args: Any, **kwargs: Any) -> None:
            self.updates.append((trainer.global_step, float(step)))
            update(step, *args, **kwargs)

        def recorded_fold(*args: Any) -> None:
            self.windows.append(trainer.global_step)
            fold(*args)

        grid.update, sampler._fold = recorded_update, recorded_fold

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])
        self.positions.append(float(pl_module.clock.position(trainer.global_step)))

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        torch.save({
            "lrs": self.lrs, "positions": self.positions, "updates": self.updates, "windows": self.windows,
            "steps": trainer.global_step, "rays_per_step": trainer.datamodule.rays_per_step(),
            "epochs": trainer.current_epoch, "lr_lambda": self.lr_lambda,
            "state": {k: v.detach().clone() for k, v in pl_module.state_dict().items()},
            "view_probs": trainer.datamodule.sampler.view_probabilities().clone(),
            "rule": pl_module.clock.rule.name,
        }, self.out / f"{self.tag}_rank{trainer.global_rank}.pt")  # fmt: skip


def _parts(scene: Path, cache: Path, multiple: int, rule: str = RULE) -> tuple[NeRFDataModule, NeRFModule]:
    sampler = functools.partial(LossWeightedRaySampler, warmup_steps=4, update_every=4, alpha=2.0)
    batch_rule = replace(getattr(batch_rules, rule)(), rank_multiple=multiple, lr_warmup=WARMUP)
    dm = NeRFDataModule(
        path=str(scene), batch_size=BATCH, steps_per_epoch=8, sampler="loss_weighted",
        samplers={"loss_weighted": sampler}, cache_dir=str(cache),
        feedback=TrainingFeedback(TrainingClock(batch_rule)),
    )  # fmt: skip
    dm.setup("fit")
    model = nerf_module(
        field=functools.partial(
            NGPField, encoding=dict(n_levels=4, log2_hashmap_size=12, max_resolution=64),
            hidden_dim=16,
        ),
        optimizer=functools.partial(torch.optim.Adam, lr=1e-2),
        scheduler=DECAY,
        renderer=functools.partial(
            build_renderer,
            occupancy=functools.partial(OccupancyGrid, resolution=16, update_every=2, warmup_steps=2),
            step_size=0.054, max_samples_per_ray=32,
        ),
        aabb_scale=dm.aabb_scale, save_val_images=False, feedback=dm.feedback, backend="torch",
    )  # fmt: skip
    return dm, model


def _fit(
    scene: Path, out: Path, tag: str, devices: int, multiple: int, exchange: str = "fp32", rule: str = RULE
) -> None:
    dm, model = _parts(scene, out / "cache", multiple, rule)
    trainer = L.Trainer(
        accelerator="cpu", devices=devices, strategy="ddp_fork" if devices > 1 else "auto",
        max_steps=REFERENCE_STEPS, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[_Record(out, tag), GradientExchange(exchange)],
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)


def _heldout_psnr(scene: Path, out: Path, state: dict[str, torch.Tensor]) -> float:
    dm, model = _parts(scene, out / "cache", 1)
    model.load_state_dict(state)
    model.eval()
    values = []
    with torch.no_grad():
        for view in range(len(dm.val_set.frames)):
            v = model.render_view(dm.val_batch(view))
            mse = float(((v["rgb"] - v["gt"]) ** 2).mean())
            values.append(-10.0 * math.log10(mse))
    return sum(values) / len(values)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    out = tmp_path_factory.mktemp("batch_rule")
    scene = generate_scene(out / "scene", n_views=8, width=24, height=24, supersample=1).parent
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # before the forks: the ranks share two cores; OpenMP does not survive a fork
    try:
        torch.manual_seed(0)
        _fit(scene, out, "ddp2", devices=2, multiple=1)
        torch.manual_seed(0)
        _fit(scene, out, "ddp2_bf16", devices=2, multiple=1, exchange="bf16")
        _fit(scene, out, "one_x2", devices=1, multiple=2, rule=SEVERAL)
        _fit(scene, out, "one_x1", devices=1, multiple=1)
    finally:
        torch.set_num_threads(threads)
    return out, scene


def _load(out: Path, tag: str, rank: int = 0) -> dict[str, Any]:
    return torch.load(out / f"{tag}_rank{rank}.pt")


def test_two_ranks_follow_the_schedule_of_one_process_with_their_batch(runs: tuple[Path, Path]) -> None:
    out, _ = runs
    r0, r1, one = _load(out, "ddp2", 0), _load(out, "ddp2", 1), _load(out, "one_x2")
    assert r0["steps"] == r1["steps"] == one["steps"] == REFERENCE_STEPS // 2  # the run counts rays
    assert r0["rays_per_step"] == BATCH and one["rays_per_step"] == 2 * BATCH  # the same rays per step
    for key in ("lrs", "positions", "updates", "windows"):
        assert r0[key] == r1[key] == one[key], key
    assert r0["positions"] == [2.0 * s for s in range(REFERENCE_STEPS // 2)]
    assert r0["lr_lambda"].startswith("on_clock.")  # the schedule read at reference positions
    assert r0["rule"] == r1["rule"] == one["rule"] == SEVERAL  # auto on two ranks


def test_one_process_with_the_configured_batch_trains_as_per_device(runs: tuple[Path, Path]) -> None:
    """k = 1 under the rule: the factory's own schedule (no clock in between), steps as configured."""
    one, two = _load(runs[0], "one_x1"), _load(runs[0], "ddp2")
    assert one["rule"] == "per_device"  # auto on one process
    assert one["lr_lambda"] == "ngp_exponential_decay.<locals>.factor"
    assert one["positions"] == [float(s) for s in range(REFERENCE_STEPS)]
    # epochs of data.steps_per_epoch=8 reference steps: as many epochs for both (4 or 8 optimizer steps)
    assert one["epochs"] == two["epochs"] == REFERENCE_STEPS // 8


def test_the_schedule_over_rays_is_that_of_the_configured_batch(runs: tuple[Path, Path]) -> None:
    """Against one process with the configured batch (twice the optimizer steps): at reference step p the
    hash table's learning rate is that of the rule's decay there (large_batch: x 0.1 from 70 % of the run,
    89.6 reference steps, every 10 %, 12.8; the configured one from 50 % every 25 %) times the ramp to 2
    (lr x k); the grid updates every 2 optimizer steps
    in both (the rules in rays keep it in optimizer steps), so every 4 reference steps at the doubled
    batch; each sampler window folds at the first step of the doubled batch at or past the window's."""
    out, _ = runs
    two, one = _load(out, "ddp2"), _load(out, "one_x1")
    assert one["steps"] == REFERENCE_STEPS
    for s, lr in enumerate(two["lrs"]):
        ramp = 1.0 + (2.0 - 1.0) * min(1.0, 2 * s / WARMUP)
        decays = 0 if 2 * s < 89.6 else int((2 * s - 89.6) // 12.8) + 1
        assert lr == pytest.approx(1e-2 * 0.1**decays * ramp, rel=1e-12), s
    assert two["lrs"][44] == pytest.approx(2e-2) and two["lrs"][45] == pytest.approx(2e-3)  # 88, 90
    # lr: 1e-2 for the first half of the reference steps, then x 0.1 at 1/2 and 3/4 (decay 0.5, 0.25)
    half, quarter = REFERENCE_STEPS // 2, REFERENCE_STEPS // 4
    assert one["lrs"][half - 1] == pytest.approx(1e-2) and one["lrs"][half] == pytest.approx(1e-3)
    assert one["lrs"][half + quarter] == pytest.approx(1e-4)
    assert [p for _, p in one["updates"]] == [float(p) for p in range(2, REFERENCE_STEPS + 1, 2)]
    assert two["updates"] == [(s, float(s)) for s in range(2, REFERENCE_STEPS // 2 + 1, 2)]
    windows_one = [float(s) for s in one["windows"]]  # positions of the configured batch's windows
    assert windows_one == [float(p) for p in range(3, REFERENCE_STEPS, 4)]  # the sampler counts one ahead
    assert [2.0 * s for s in two["windows"]] == [2.0 * math.ceil(p / 2) for p in windows_one]


@pytest.mark.parametrize("tag", ["ddp2", "ddp2_bf16"])
def test_ranks_keep_grid_sampler_and_weights_identical(runs: tuple[Path, Path], tag: str) -> None:
    out, _ = runs
    r0, r1 = _load(out, tag, 0), _load(out, tag, 1)
    assert torch.equal(r0["view_probs"], r1["view_probs"])
    for key, value in r0["state"].items():
        torch.testing.assert_close(r1["state"][key], value, rtol=0, atol=0, msg=key)


def test_bf16_gradients_keep_the_heldout_psnr(runs: tuple[Path, Path]) -> None:
    out, scene = runs
    # the same seeds: only the exchange differs, and it did round (float32 runs repeat bit for bit)
    table = "field.encoding.params"
    assert not torch.equal(_load(out, "ddp2")["state"][table], _load(out, "ddp2_bf16")["state"][table])
    fp32 = _heldout_psnr(scene, out, _load(out, "ddp2")["state"])
    bf16 = _heldout_psnr(scene, out, _load(out, "ddp2_bf16")["state"])
    untrained = _heldout_psnr(scene, out, _parts(scene, out / "cache", 1)[1].state_dict())
    assert fp32 > untrained + 1.0  # it trained (measured: 10.96 -> 13.52 dB)
    # bf16 rounding moves this short chaotic run a little, by a different amount per CPU arithmetic
    # (measured under lr x 2: 0.13 dB with avx2 kernels); 0.25 dB is a tenth of what the run gains over
    # the untrained field
    assert abs(bf16 - fp32) < 0.25, (fp32, bf16)
