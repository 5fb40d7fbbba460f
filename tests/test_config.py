"""The config contract: every group composes and builds the Lightning objects it names."""

from __future__ import annotations

from pathlib import Path

import hydra
import pytest
import torch
from lightning.pytorch.plugins.precision import DoublePrecision, MixedPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

STRATEGIES = {"single": SingleDeviceStrategy, "ddp": DDPStrategy, "fsdp": FSDPStrategy}
PRECISIONS = {"32": "32-true", "16-mixed": "16-mixed", "bf16-mixed": "bf16-mixed"}


def test_default_config_resolves(compose_cfg) -> None:
    cfg = compose_cfg()
    container = OmegaConf.to_container(cfg, resolve=True)
    assert container["data"]["path"] is None
    assert container["model"]["net"]["field"]["encoding"]["n_levels"] == 16
    # precision=auto, resolved per machine: 32-true without an Ampere+ GPU (utils/precision.py)
    expected = (
        "bf16-mixed"
        if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8
        else "32-true"
    )
    assert container["trainer"]["precision"] == expected
    assert cfg.optimized_metric == "val/psnr"


def test_issue_example_overrides_compose(compose_cfg) -> None:
    cfg = compose_cfg("strategy=ddp", "devices=4", "precision=bf16-mixed", "accumulate_grad_batches=2")
    assert cfg.trainer.devices == 4
    assert cfg.trainer.accumulate_grad_batches == 2
    assert cfg.trainer.precision == "bf16-mixed"
    assert cfg.trainer.strategy._target_.endswith("DDPStrategy")


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("precision", sorted(PRECISIONS))
def test_strategy_precision_build_a_trainer(compose_cfg, strategy: str, precision: str) -> None:
    """Each strategy x precision builds its Lightning objects and a Trainer where valid here."""
    cfg = compose_cfg(
        f"strategy={strategy}", f"precision='{precision}'", "accelerator=cpu", "devices=1", "logger=none"
    )
    strategy_obj = hydra.utils.instantiate(cfg.trainer.strategy)
    assert isinstance(strategy_obj, STRATEGIES[strategy])
    assert cfg.trainer.precision == PRECISIONS[precision]
    if strategy == "fsdp" and not torch.cuda.is_available():
        with pytest.raises(Exception, match="requires a GPU"):
            hydra.utils.instantiate(cfg.trainer, logger=False)
        return
    if precision == "16-mixed" and not torch.cuda.is_available():
        # fp16 AMP does not exist on CPUs: Lightning says so and falls back to bf16 autocast.
        with pytest.warns(UserWarning, match="not supported on CPU"):
            trainer = hydra.utils.instantiate(cfg.trainer, logger=False)
    else:
        trainer = hydra.utils.instantiate(cfg.trainer, logger=False)
    assert isinstance(trainer.strategy, STRATEGIES[strategy])
    plugin = trainer.strategy.precision_plugin
    assert isinstance(plugin, Precision)
    if precision == "32":
        assert not isinstance(plugin, (MixedPrecision, DoublePrecision))
    else:
        assert getattr(plugin, "precision", "") in ("bf16-mixed", "16-mixed", "bf16-true", "16-true")


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_fsdp_mixed_precision_keeps_float32_parameters(compose_cfg, precision: str) -> None:
    """Under FSDP, ``-mixed`` is autocast over float32 parameters, as under DDP: a half-precision hash
    table would leave the CUDA kernels for the PyTorch reference."""
    cfg = compose_cfg("strategy=fsdp", f"precision={precision}", "accelerator=cpu", "logger=none")
    config = hydra.utils.instantiate(cfg.trainer.strategy).mixed_precision_config
    assert (config.param_dtype, config.reduce_dtype, config.buffer_dtype) == (torch.float32,) * 3



@pytest.mark.parametrize("logger", ["csv", "tensorboard", "wandb", "none"])
def test_logger_group(compose_cfg, logger: str, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    cfg = compose_cfg(f"logger={logger}")
    built = [hydra.utils.instantiate(node) for node in (cfg.logger or {}).values()]
    assert len(built) == (0 if logger == "none" else 1)



def test_cpu_preset_composes(compose_cfg) -> None:
    cfg = compose_cfg("experiment=cpu", "data.downscale=8", "trainer.max_steps=200")
    assert cfg.accelerator == "cpu"
    assert cfg.data.downscale == 8 and cfg.trainer.max_steps == 200  # user overrides win over the preset
    assert cfg.model.net.backend == "torch"


def test_auto_precision_is_bf16_mixed_on_ampere_and_later_gpus_only(monkeypatch) -> None:
    from nerf_lightning.utils.precision import resolve_precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_precision("auto") == "32-true"  # a CPU machine keeps the CPU preset's numbers
    assert resolve_precision("16-mixed") == "16-mixed"  # an explicit choice is kept
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    assert resolve_precision("auto") == "bf16-mixed"
    assert resolve_precision("auto", "gpu") == "bf16-mixed"
    assert resolve_precision("auto", "cpu") == "32-true"  # accelerator=cpu on a GPU machine
    assert resolve_precision("32-true") == "32-true"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
    assert resolve_precision("auto") == "32-true"  # no m16n8k16 MMA before Ampere



def test_experiment_presets(compose_cfg, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NERF_LIGHTNING_FOX", raising=False)
    cfg = compose_cfg("experiment=fox")
    with pytest.raises(InterpolationResolutionError, match="NERF_LIGHTNING_FOX"):
        OmegaConf.to_container(cfg.data, resolve=True)  # says which variable (or data.path) is missing
    monkeypatch.setenv("NERF_LIGHTNING_FOX", str(tmp_path))
    cfg = compose_cfg("experiment=fox")
    assert cfg.data.path == str(tmp_path) and cfg.data.format == "ngp"
    assert cfg.model.net.renderer.cone_angle == pytest.approx(1 / 256)
    assert compose_cfg("experiment=fox", "data.path=/data/fox").data.path == "/data/fox"

    blender = compose_cfg("experiment=blender", "data.path=/data/lego")
    assert (blender.data.format, blender.model.net.renderer.cone_angle) == ("blender", 0.0)
    fast, quality, default = compose_cfg("experiment=fast"), compose_cfg("experiment=quality"), compose_cfg()
    assert fast.trainer.max_steps < default.trainer.max_steps < quality.trainer.max_steps
    sizes = [c.model.net.field.encoding.log2_hashmap_size for c in (fast, default, quality)]
    assert sizes[0] < sizes[1] < sizes[2]


def test_grad_exchange_bf16_reaches_ddp_and_fsdp(compose_cfg) -> None:
    """``grad_exchange=bf16``: FSDP reduce-scatters in bfloat16; under DDP the train app adds the callback
    that registers the hook (``callbacks/grad_exchange.py``)."""
    cfg = compose_cfg("strategy=fsdp", "grad_exchange=bf16", "accelerator=cpu", "logger=none")
    config = hydra.utils.instantiate(cfg.trainer.strategy).mixed_precision_config
    assert (config.param_dtype, config.reduce_dtype) == (torch.float32, torch.bfloat16)
    assert compose_cfg("strategy=ddp").grad_exchange == "fp32"
    with pytest.raises(Exception, match="grad_exchange must be one of"):
        hydra.utils.instantiate(compose_cfg("strategy=fsdp", "grad_exchange=fp8").trainer.strategy)


BATCH_RULES = ["auto", "per_device", "large_batch", "throughput"]


@pytest.mark.parametrize("rule", BATCH_RULES)
def test_every_batch_rule_composes_into_a_clock(compose_cfg, rule: str) -> None:
    from nerf_lightning.training.clock import TrainingClock

    clock = TrainingClock(hydra.utils.instantiate(compose_cfg(f"batch_rule={rule}").batch_rule))
    assert clock.configured.name == rule and clock.k == 1.0


@pytest.mark.parametrize("strategy", ["single", "ddp", "fsdp"])
def test_the_default_batch_rule_is_auto_large_batch_on_two_ranks(compose_cfg, strategy: str) -> None:
    from nerf_lightning.training.clock import TrainingClock

    cfg = compose_cfg(f"strategy={strategy}")
    clock = TrainingClock(hydra.utils.instantiate(cfg.batch_rule))
    assert clock.configured.name == "auto"
    assert clock.rule.name == "per_device"  # before the world size is known: the per-rank batch is the same
    clock.bind(1)
    assert clock.rule.name == "per_device" and clock.trivial  # one GPU exactly as before
    clock.bind(2)
    assert clock.rule.name == "large_batch" and clock.k == 2.0
    clock.bind(4)
    assert clock.rule.name == "per_device" and clock.k == 4.0
