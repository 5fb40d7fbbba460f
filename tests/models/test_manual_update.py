"""``model.graph_optimizer``: the module's own update under Lightning's manual optimization is the automatic
loop's, step for step (on the CPU its eager form: forward, backward, Adam, the schedule's step); a run
resumed under the other kind continues the saved step count; a graphed run's checkpoint holds the eager
optimizer's plain learning rates; ``auto`` chooses manual optimization only where the update can join the
step's CUDA graph. The graph itself is tested on the GPU (``tests/models/test_update_graph_cuda.py``)."""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch

from nerf_lightning.data.datamodule import NeRFDataModule
from nerf_lightning.data.synthetic import generate_scene
from nerf_lightning.models import module as module_code
from nerf_lightning.models.module import NeRFModule
from nerf_lightning.models.train_step import TrainStep
from nerf_lightning.models.update_graph import check_capturable, graph_learning_rates, plain_groups
from nerf_lightning.training.lr_schedules import ngp_exponential_decay
from tests.models.tiny_training import QUIET, fit_on_one_thread, tiny_module

STEPS = 24
#: the decay starts at step 8 and steps every 4: six different rates in 24 steps (five changes)
SCHEDULE = functools.partial(ngp_exponential_decay, decay_start=8, decay_interval=4, decay_base=0.5)


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("manual") / "scene"
    return generate_scene(out, n_views=8, width=24, height=24, supersample=1).parent


def _fit(path: Path, mode: bool | str, steps: int, root: Path, resume: str | None = None) -> NeRFModule:
    torch.manual_seed(0)
    dm = NeRFDataModule(path=str(path), batch_size=256, steps_per_epoch=STEPS, cache_dir=str(path / "cache"))
    dm.setup("fit")
    model = tiny_module(dm, scheduler=SCHEDULE, graph_optimizer=mode)
    counter = _StepCounter()
    trainer = L.Trainer(
        # max_epochs: a step left uncounted ends the run after 2 epochs instead of never
        max_steps=steps, max_epochs=2, num_sanity_val_steps=0, limit_val_batches=0, default_root_dir=root,
        enable_checkpointing=False, callbacks=[counter], **QUIET,
    )  # fmt: skip
    threads = torch.get_num_threads()
    if resume is None:
        fit_on_one_thread(trainer, model, dm)
    else:
        torch.set_num_threads(1)
        try:
            trainer.fit(model, datamodule=dm, ckpt_path=resume)
        finally:
            torch.set_num_threads(threads)
    model.trainer_after, model.steps_run = trainer, counter.steps  # type: ignore[attr-defined]
    return model


class _StepCounter(L.Callback):
    """The training steps this fit ran."""

    steps = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.steps += 1


def _weights(model: NeRFModule) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_manual_update_is_the_automatic_loop_step_for_step(capture: Path, tmp_path: Path) -> None:
    automatic = _fit(capture, False, STEPS, tmp_path / "a")
    manual = _fit(capture, True, STEPS, tmp_path / "m")
    assert automatic.automatic_optimization and not manual.automatic_optimization
    assert automatic.global_step == manual.global_step == STEPS
    # the schedule stepped once per optimizer step: 0.5 ** (1 + (24 - 8) // 4) = 0.5 ** 5 of 1e-2
    for model in (automatic, manual):
        optimizer = model.trainer_after.optimizers[0]
        assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1e-2 * 0.5**5] * 2)
    assert torch.equal(_weights(automatic), _weights(manual))


def test_a_run_resumed_under_the_other_kind_continues_its_step_count(capture: Path, tmp_path: Path) -> None:
    for first, then in ((False, True), (True, False)):
        root = tmp_path / f"{first}-{then}"
        half = _fit(capture, first, STEPS // 2, root)
        ckpt = root / "half.ckpt"
        half.trainer_after.save_checkpoint(ckpt)
        resumed = _fit(capture, then, STEPS, root, resume=str(ckpt))
        assert half.steps_run == resumed.steps_run == STEPS // 2, (first, then)  # not 24 steps from 0
        assert resumed.global_step == STEPS, (first, then)
        optimizer = resumed.trainer_after.optimizers[0]
        assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([1e-2 * 0.5**5] * 2)


def test_the_loop_around_a_captured_update(
    capture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module's path around a captured update, with an eager stand-in for the CUDA graph (the graph is
    the GPU test's): captured once, after one eager update; each later step counted by hand; the schedule
    refreshing tensor learning rates in place; a checkpoint with the eager optimizer's float rates."""
    captures: list[int] = []

    def stand_in(step: Any, optimizer: torch.optim.Optimizer, batch: Any, precision: Any, **_: Any) -> Any:
        captures.append(len(optimizer.state))
        for group in optimizer.param_groups:  # as graph_learning_rates does on a GPU
            group["lr"] = torch.tensor(float(group["lr"]))

        def update(b: Any) -> Any:
            outputs = TrainStep.forward(step, b)
            outputs[0].backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return outputs

        return update

    monkeypatch.setattr(module_code, "capture_update", stand_in)
    monkeypatch.setattr(NeRFModule, "_graphs_update", lambda self, trainer=None: True)
    graphed = _fit(capture, "auto", STEPS, tmp_path / "g")
    assert not graphed.automatic_optimization and graphed.unowned.update is not None
    assert captures == [len(list(graphed.train_step_fn.parameters()))]  # once, Adam's state allocated
    assert graphed.steps_run == graphed.global_step == STEPS
    optimizer = graphed.trainer_after.optimizers[0]
    rates = [g["lr"] for g in optimizer.param_groups]
    assert all(isinstance(r, torch.Tensor) for r in rates)
    assert [float(r) for r in rates] == pytest.approx([1e-2 * 0.5**5] * 2)
    automatic = _fit(capture, False, STEPS, tmp_path / "a")
    assert torch.allclose(_weights(graphed), _weights(automatic), rtol=1e-5, atol=1e-7)
    graphed.trainer_after.save_checkpoint(tmp_path / "g.ckpt")
    saved = torch.load(tmp_path / "g.ckpt", weights_only=True)["optimizer_states"][0]["param_groups"]
    assert [type(g["lr"]) for g in saved] == [float, float]
    assert [g["lr"] for g in saved] == pytest.approx([1e-2 * 0.5**5] * 2)


def test_plain_groups_turn_the_graph_learning_rates_back_into_floats() -> None:
    params = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    optimizer = torch.optim.Adam([{"params": params[:1]}, {"params": params[1:], "lr": 3e-3}], lr=1e-2)
    graph_learning_rates(optimizer, torch.device("cpu"))
    assert [float(g["lr"]) for g in optimizer.param_groups] == pytest.approx([1e-2, 3e-3])
    assert all(isinstance(g["lr"], torch.Tensor) and g["capturable"] for g in optimizer.param_groups)
    saved = plain_groups(optimizer.state_dict())
    assert [g["lr"] for g in saved["param_groups"]] == pytest.approx([1e-2, 3e-3])
    assert all(type(g["lr"]) is float and g["capturable"] is False for g in saved["param_groups"])
    assert all(isinstance(g["lr"], torch.Tensor) for g in optimizer.param_groups)  # the optimizer's own


def test_an_update_is_captured_only_from_an_optimizer_that_can_be() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match=r"model.graph_optimizer: SGD has no capturable update"):
        check_capturable(torch.optim.SGD([p], lr=0.1), [p])
    other = torch.nn.Parameter(torch.ones(2))  # the optimizer's, not the step's: never needs a state
    adam = torch.optim.Adam([p, other], lr=0.1)
    with pytest.raises(ValueError, match=r"state is not allocated for 1 parameters"):
        check_capturable(adam, [p])
    p.grad = torch.ones(3)
    adam.step()
    check_capturable(adam, [p])  # one eager update allocated it


def _trainer(device: str = "cuda", **kwargs: Any) -> Any:
    values = dict(world_size=1, accumulate_grad_batches=1, gradient_clip_val=None, precision="bf16-mixed")
    values.update(kwargs)
    return SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)), **values)


@pytest.mark.parametrize(
    ("trainer", "mode", "manual"),
    [
        (_trainer(), "auto", True),
        (_trainer(precision="32-true"), "auto", True),
        (_trainer("cpu"), "auto", False),
        (_trainer(world_size=2), "auto", False),
        (_trainer(accumulate_grad_batches=2), "auto", False),
        (_trainer(gradient_clip_val=1.0), "auto", False),
        (_trainer(precision="16-mixed"), "auto", False),
        (_trainer(), False, False),
        (_trainer("cpu"), True, True),
        (None, "auto", False),
    ],
)
def test_auto_chooses_manual_optimization_where_the_update_can_join_the_graph(
    capture: Path, trainer: Any, mode: Any, manual: bool
) -> None:
    dm = NeRFDataModule(path=str(capture), batch_size=256, cache_dir=str(capture / "cache"))
    dm.setup("fit")
    model = tiny_module(dm, graph_optimizer=mode)
    model.unowned.step.budgeted = True  # as under model.net.step's sample budget
    assert model._updates_manually(trainer) is manual
