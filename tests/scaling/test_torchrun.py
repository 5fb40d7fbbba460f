"""torchrun across two "nodes" on localhost (gloo, one process each): the training command is unchanged.

Two torchrun agents meet through a c10d rendezvous, as on two machines. Checks: Lightning picks up
torchelastic's ranks; both ranks share one run directory with one metrics.json; their occupancy grids
(all-reduced after every update) and parameters are bit-identical; when one node dies, the other
exits with an error instead of hanging.

The two scenarios are independent (ports, run ids, folders of their own): the node-death run starts in
the background with the module and its four processes start up while the other test's do.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

from nerf_lightning.run.checkpoint_io import read_checkpoint

from .conftest import TINY_RUN, clean_env, free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc to find torchrun's workers"),
]

STEPS = 24


def _agent_main(argv: list[str], cwd: str, log: str, env: dict[str, str]) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)  # not the test runner's capture
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    import gc
    import traceback

    from torch.distributed.run import main

    gc.freeze()  # the test process's objects stay where they are: no collection copies their pages
    code = 0
    try:
        main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - reported in the log, as `python -m torch.distributed.run` does
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    os._exit(code)


def _agent(node: int, port: int, run_id: str, cwd: Path, log: Path, *overrides: str) -> mp.Process:
    """One node: a torchrun agent (``python -m torch.distributed.run``'s ``main()``, forked from the test
    process: no interpreter start-up) running ``python -m nerf_lightning.train`` in its worker."""
    argv = [
        "--nnodes=2", "--nproc-per-node=1",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
        "--max-restarts=0", "--monitor-interval=0.5",
        "-m", "nerf_lightning.train", "strategy=ddp", "num_nodes=2", "devices=1", *overrides,
    ]  # fmt: skip
    proc = mp.get_context("fork").Process(target=_agent_main, args=(argv, str(cwd), str(log), clean_env()))
    proc.start()
    return proc


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _kill_node(proc: mp.Process) -> None:
    """SIGKILL a node: the agent and its workers (torchrun starts each worker in a session of its own)."""
    for pid in _children(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.is_alive():
        proc.kill()
    proc.join()


def _wait(proc: mp.Process, timeout: float) -> int | None:
    """The agent's exit status (None: still running after ``timeout`` s)."""
    proc.join(timeout=timeout)
    return proc.exitcode


def _start_node_death(scene: Path, tmp_path: Path) -> tuple[list[mp.Process], list[Path]]:
    """Two nodes that train far longer than anyone waits (the survivor can only stop by failing)."""
    port = free_port()
    # last.ckpt every 4th step: its file is the sign that the ranks are inside the training loop
    every_4 = [
        "callbacks.last_checkpoint.every_n_seconds=0",
        "callbacks.last_checkpoint.check_every_n_steps=4",
    ]
    args = [f"data.path={scene}", "trainer.max_steps=100000", *TINY_RUN, *every_4]
    logs = [tmp_path / f"node{n}.log" for n in range(2)]
    return [_agent(n, port, "job43", tmp_path, logs[n], *args) for n in range(2)], logs


def _node_death(nodes: list[mp.Process], logs: list[Path], result: dict) -> None:
    """Once the two nodes formed their process group, node 1 is killed. ``result``: the nodes' exit
    codes and how long the survivor took to exit, or ``error``."""
    try:
        deadline = time.monotonic() + 180
        run_root = logs[0].parent
        while not any(run_root.rglob("last.ckpt")):  # the group formed and trained 4 steps
            if not all(n.is_alive() for n in nodes):
                result["error"] = "a node exited before training started"
                return
            if time.monotonic() > deadline:
                result["error"] = "the two nodes never trained 4 steps together"
                return
            time.sleep(0.2)
        if not all(n.is_alive() for n in nodes):
            result["error"] = "a node exited before it was killed"
            return
        _kill_node(nodes[1])  # node 1 dies: its agent and its worker
        killed_at = time.monotonic()
        result["survivor_code"] = _wait(nodes[0], timeout=90)
        result["detect_s"] = time.monotonic() - killed_at
    finally:
        for p in nodes:
            _kill_node(p)
        result["killed_code"] = nodes[1].exitcode


@pytest.fixture(scope="module")
def node_death(tiny_scene: Path, tmp_path_factory: pytest.TempPathFactory):
    """The node-death scenario, running in a background thread from the module's first test on; call
    the fixture's value for its result."""
    nodes, logs = _start_node_death(tiny_scene, tmp_path_factory.mktemp("node_death"))
    result: dict = {"logs": logs}

    def run() -> None:
        try:
            _node_death(nodes, logs, result)
        except BaseException:  # noqa: BLE001 - reported by the test
            result["error"] = traceback.format_exc()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def wait() -> dict:
        thread.join(timeout=400)
        assert not thread.is_alive(), "the node-death scenario did not finish"
        return result

    yield wait
    thread.join(timeout=400)


@pytest.mark.usefixtures("node_death")  # started now: its nodes start up alongside this test's
@pytest.mark.repro  # two torchrun nodes training (about 30 s): make test-repro, as CI runs it
def test_two_nodes_share_one_run_and_identical_grids(tiny_scene: Path, tmp_path: Path) -> None:
    port = free_port()
    args = [
        f"data.path={tiny_scene}", f"trainer.max_steps={STEPS}", "debug=rank_state", *TINY_RUN,
        # the loss-weighted sampler's statistics are all-reduced too; compare inside the run
        "data.sampler=loss_weighted", "data.samplers.loss_weighted.warmup_steps=4",
        "data.samplers.loss_weighted.update_every=4", "callbacks.rank_state.check_every_n_steps=4",
        # last.ckpt's time trigger: rank 0's clock decides for both ranks at every 4th step (a
        # broadcast each time: a rank that skipped it would hang the other)
        "callbacks.last_checkpoint.every_n_seconds=0", "callbacks.last_checkpoint.check_every_n_steps=4",
    ]  # fmt: skip
    nodes = [_agent(n, port, "job42", tmp_path, tmp_path / f"node{n}.log", *args) for n in range(2)]
    try:
        codes = [_wait(p, timeout=240) for p in nodes]
    finally:
        for p in nodes:
            _kill_node(p)
    logs = "\n".join((tmp_path / f"node{n}.log").read_text()[-3000:] for n in range(2))
    assert codes == [0, 0], logs

    runs = sorted((tmp_path / "outputs" / "runs" / "train").iterdir())
    assert [r.name for r in runs] == ["torchrun-job42"], runs  # named after --rdzv-id, shared by all
    run = runs[0]
    assert [p.relative_to(tmp_path) for p in tmp_path.rglob("metrics.json")] == [
        run.relative_to(tmp_path) / "metrics.json"
    ]
    metrics = json.loads((run / "metrics.json").read_text())
    # the default rule on two ranks (large_batch) counts rays: STEPS reference steps, STEPS / 2 optimizer
    # steps
    assert metrics["batch/rule"] == "large_batch" and metrics["batch/k"] == 2.0
    assert metrics["batch/world_size"] == 2
    # as the check of the batch rule on real GPUs reads a run (experiments batch-rule-ddp*)
    from benchmarks.readers import ddp_run

    (row,) = ddp_run("default")(run, run / "log")
    assert (row["world"], row["rule"], row["exchange"], row["length"]) == (2, "large_batch", "fp32", STEPS)
    steps = STEPS // 2
    assert metrics["steps"] == steps and metrics["train/rays_per_s"] > 0
    assert int(read_checkpoint(run / "checkpoints" / "last.ckpt")["global_step"]) == steps
    # only rank 0 wrote the Hydra config; rank 1 logged to its own file in the same directory
    assert [p.name for p in run.glob(".hydra*")] == [".hydra"]
    assert (run / "train.log").is_file() and (run / "train_rank1.log").is_file()

    states = [json.loads((run / "rank_state" / f"rank{r}.json").read_text()) for r in range(2)]
    assert [(s["rank"], s["world_size"], s["local_rank"]) for s in states] == [(0, 2, 0), (1, 2, 0)]
    assert sorted(s["node_rank"] for s in states) == [0, 1]
    assert {s["cluster_environment"] for s in states} == {"TorchElasticEnvironment"}
    assert {s["run_dir"] for s in states} == {str(run.resolve())}
    assert {s["global_step"] for s in states} == {steps}
    # The grid was updated and pruned (not the all-True initial state), and is bit-identical on both ranks.
    assert 0.0 < states[0]["occupancy"]["occupied_fraction"] < 1.0
    assert states[0]["occupancy"] == states[1]["occupancy"]
    assert states[0]["parameters"] == states[1]["parameters"]
    assert states[0]["sampler"] == states[1]["sampler"]
    assert states[0]["checks"] == states[1]["checks"] == steps // 4  # equal at every check in the run
    assert states[0]["first_batch"] != states[1]["first_batch"]  # but each rank drew its own rays


def test_when_one_node_dies_the_other_exits_with_an_error(node_death) -> None:
    result = node_death()
    logs = result.get("logs", [])
    assert "error" not in result, result.get("error", "") + "\n" + "\n".join(
        p.read_text()[-3000:] for p in logs if p.exists()
    )
    assert result["killed_code"] != 0
    assert result["survivor_code"] not in (0, None), logs[0].read_text()[-3000:]
    assert result["detect_s"] < 60, f"survivor took {result['detect_s']:.0f} s to give up"
