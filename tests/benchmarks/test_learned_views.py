"""Issue 61's decision rule on learned poses and exposure (``benchmarks/learned_views.py``), and its GPU
script (``benchmarks/learned_views_gpu.sh``) run end to end on a generated scene on the CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from gpu_scripts import TINY, run_script

from benchmarks.learned_views import FAIR, decide, judge, main, train_psnr


def rows(fitted: dict[str, dict[str, float]]) -> list[dict]:
    """Rows of the fair metric per capture and variant (the plain one 1 dB lower, which must not count)."""
    return [
        {"scene": scene, "variant": variant, "seed": 0, FAIR: value, "val/psnr": value - 1.0}
        for scene, by_variant in fitted.items()
        for variant, value in by_variant.items()
    ]


def scores(**deltas: tuple[float, float]) -> list[dict]:
    """Fox and fruit rows: off at 30 and 25 dB, each variant at off + its (fox, fruit) change."""
    base = {"fox": 30.0, "fruit": 25.0}
    return rows({
        scene: {"off": off, **{v: off + d[i] for v, d in deltas.items()}}
        for i, (scene, off) in enumerate(base.items())
    })  # fmt: skip


def test_a_correction_is_adopted_on_a_mean_gain_with_no_loss_beyond_the_bound() -> None:
    verdicts = judge(scores(camera_opt=(-0.5, +0.1), appearance=(-0.05, +0.5), both=(-0.6, +0.5)))
    assert verdicts["appearance"].deltas == pytest.approx({"fox": -0.05, "fruit": 0.5})
    assert verdicts["appearance"].mean == pytest.approx(0.225)
    assert verdicts["appearance"].passes and not verdicts["camera_opt"].passes
    assert decide(verdicts) == {"camera_opt": False, "appearance": True}


@pytest.mark.parametrize(
    ("fox", "fruit", "passes"),
    [
        (+0.2, +0.2, True),  # exactly the gain
        (+0.19, +0.2, False),  # mean 0.195
        (-0.1, +0.5, True),  # exactly the loss bound
        (-0.11, +1.0, False),  # a large mean gain does not excuse a loss on one capture
    ],
)
def test_the_rule_bounds(fox: float, fruit: float, passes: bool) -> None:
    verdicts = judge(scores(camera_opt=(fox, fruit), appearance=(0.0, 0.0), both=(fox, fruit)))
    assert verdicts["camera_opt"].passes is passes
    assert decide(verdicts)["camera_opt"] is passes


def test_the_fair_metric_decides_not_the_plain_one() -> None:
    data = scores(camera_opt=(+0.3, +0.3), appearance=(0.0, 0.0), both=(0.0, 0.0))
    for r in data:  # the plain metric says the opposite
        r["val/psnr"] = 40.0 if r["variant"] == "off" else 20.0
    assert decide(judge(data))["camera_opt"] is True


def test_two_passing_corrections_stay_together_only_if_both_passes() -> None:
    together = judge(scores(camera_opt=(+0.3, +0.3), appearance=(+0.4, +0.4), both=(+0.5, +0.5)))
    assert decide(together) == {"camera_opt": True, "appearance": True}
    apart = judge(scores(camera_opt=(+0.3, +0.3), appearance=(+0.4, +0.4), both=(-0.5, +0.5)))
    assert decide(apart) == {"camera_opt": False, "appearance": True}  # the larger gain alone


def test_a_missing_or_failed_run_leaves_its_correction_undecided(tmp_path: Path) -> None:
    data = scores(camera_opt=(+0.3, +0.3), appearance=(+0.4, +0.4), both=(+0.5, +0.5))
    no_fruit_poses = [r for r in data if (r["scene"], r["variant"]) != ("fruit", "camera_opt")]
    assert set(judge(no_fruit_poses)) == {"appearance", "both"}
    assert decide(judge(no_fruit_poses)) == {"camera_opt": None, "appearance": True}
    data = [{**r, FAIR: float("nan")} if (r["scene"], r["variant"]) == ("fox", "off") else r for r in data]
    verdicts = judge(data)  # fox's off was cut short: nothing can be compared with it
    assert verdicts == {}
    assert decide(verdicts) == {"camera_opt": None, "appearance": None}
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in data))
    assert main(["decide", str(results)]) == 1


def test_decide_prints_and_writes_the_decision(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "results.jsonl"
    data = scores(camera_opt=(-3.0, -1.0), appearance=(-1.0, +0.3), both=(-4.0, -0.3))
    results.write_text("".join(json.dumps(r) + "\n" for r in data))
    assert main(["decide", str(results), "--json", str(tmp_path / "decision.json")]) == 0
    out = capsys.readouterr().out
    assert "appearance: fox -1.00, fruit +0.30 dB" in out and "fails the rule" in out
    assert "decision: model.appearance.enabled: false" in out
    doc = json.loads((tmp_path / "decision.json").read_text())
    assert doc["defaults"] == {"camera_opt": False, "appearance": False}
    assert doc["rule"] == {"metric": FAIR, "min_mean_gain_db": 0.2, "max_loss_db": 0.1}


def test_training_psnr_is_the_mean_of_the_last_logged_points(tmp_path: Path) -> None:
    log = tmp_path / "csv" / "metrics.csv"
    log.parent.mkdir()
    lines = ["step,train/psnr,val/psnr"] + [f"{s},{s / 10}," for s in range(1, 21)]
    log.write_text("\n".join([*lines, "21,,17.0"]) + "\n")  # the validation row has no training PSNR
    mean, last = train_psnr(tmp_path, window=4)
    assert last == pytest.approx(2.0)
    assert mean == pytest.approx((1.7 + 1.8 + 1.9 + 2.0) / 4)
    assert train_psnr(tmp_path / "nothing") == (None, None)


# the whole script end to end on the CPU (tens of seconds): make test-repro, as CI runs it
@pytest.mark.repro
def test_the_gpu_script_runs_its_lanes_and_decides(tmp_path: Path) -> None:
    from nerf_lightning.data.synthetic import generate_scene

    data = tmp_path / "data"
    generate_scene(data / "fox", n_views=8, width=24, height=24, supersample=1)
    out = tmp_path / "out"
    proc = run_script("learned_views_gpu.sh", data, out, work=tmp_path / "work", TRAIN_ARGS=TINY,
                      SCENES="fox", VARIANTS="off appearance", STEPS="8", LANES="2")  # fmt: skip
    # camera_opt did not run: no decision on it, and the call says so by its status
    assert proc.returncode == 1, proc.stdout + proc.stderr
    files = ["decision.json", "decision.txt", "logs.tgz", "results.jsonl", "steps.tsv"]
    assert sorted(os.listdir(out)) == files  # what comes back from the GPU machine: at most 8
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["scene"], r["variant"], r["exit"], r["steps"]) for r in results] == [
        ("fox", "appearance", "0", 8), ("fox", "off", "0", 8)]  # fmt: skip
    for r in results:
        assert r["val/psnr"] > 5 and r[FAIR] > 5 and r["train/psnr_mean"] > 5
    assert "appearance/stops_std" in results[0] and "appearance/stops_std" not in results[1]
    decision = (out / "decision.txt").read_text()
    assert "decision: model.appearance.enabled:" in decision
    assert "decision: model.camera_opt.enabled: not decided" in decision
