"""The side-by-side bench with instant-ngp on the CPU: its dry run (split files and commands), the
instant-ngp driver against a stand-in ``pyngp`` whose renders are known, the kit's extraction and the
table."""

from __future__ import annotations

import io
import json
import lzma
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks import peers, readers
from nerf_lightning.data.synthetic import orbit_poses

DRIVER = Path(peers.__file__).with_name("ngp_driver.py")

#: A stand-in for pyngp: loading a transforms file natural-sorts its frames (as instant-ngp); the ground
#: truth render is the test image in linear RGB over the background; the prediction of view i is the
#: opaque sRGB grey 0.25 + 0.1 i (held in linear RGB, as pyngp returns it).
FAKE_PYNGP = '''
import json, os, re
import numpy as np

def _lin(x):
    return np.where(x <= 0.04045, x / 12.92, ((x + 0.055) / 1.055) ** 2.4)

class _Meta:
    def __init__(self, w, h):
        self.resolution = (w, h)

class _Obj:
    pass

class Testbed:
    def __init__(self):
        self.nerf = _Obj(); self.nerf.training = _Obj(); self.nerf.training.optimize_extrinsics = False
        self.training_step = 0; self.loss = 0.5; self.shall_train = False; self.render_ground_truth = False
        self.background_color = [0, 0, 0, 1]; self.view = 0

    def load_training_data(self, path):
        doc = json.load(open(path))
        key = lambda f: [int(t) if t.isdigit() else t for t in re.split(r"(\\d+)", f["file_path"])]
        frames = sorted(doc["frames"], key=key)
        d = _Obj(); d.n_images = len(frames); d.paths = [f["file_path"] for f in frames]
        d.aabb_scale = doc.get("aabb_scale", 1); root = os.path.dirname(path)
        d.images = [np.asarray(__import__("PIL.Image").Image.open(os.path.join(root, p)).convert("RGBA"),
                               dtype=np.float32) / 255.0 for p in d.paths]
        d.metadata = [_Meta(im.shape[1], im.shape[0]) for im in d.images]
        self.nerf.training.dataset = d
        self.nerf.training.get_camera_extrinsics = lambda i: ("pose", i)
        self.nerf.training.set_camera_extrinsics = lambda i, m, convert: self._log(f"set {i} {m} {convert}")
        self._log(f"load {os.path.basename(path)} extrinsics={self.nerf.training.optimize_extrinsics}")

    def frame(self):
        if self.shall_train:
            self.training_step += 1
        return True

    def set_camera_to_training_view(self, i):
        self.view = i

    def _log(self, line):
        with open(os.environ["FAKE_NGP_LOG"], "a") as log:
            log.write(line + "\\n")

    def render(self, w, h, spp, linear):
        bg = np.asarray(self.background_color, dtype=np.float32)
        if self.render_ground_truth:
            im = self.nerf.training.dataset.images[self.view]
            rgb = _lin(im[..., :3]) * im[..., 3:] + bg[:3] * (1 - im[..., 3:])
            return np.concatenate([rgb, np.ones_like(im[..., 3:])], -1)
        grey = np.float32(_lin(np.float32(0.25 + 0.1 * self.view)))
        return np.concatenate([np.full((h, w, 3), grey, np.float32), np.ones((h, w, 1), np.float32)], -1)
'''


def _srgb_psnr(pred: float, gt: float) -> float:
    return -10.0 * np.log10((pred - gt) ** 2)


@pytest.fixture()
def capture(tmp_path: Path) -> Path:
    """An instant-ngp capture of 17 frames (image 4 missing) of 16 x 12 with a lens and aabb_scale 2,
    every image a uniform grey 0.5 (128/255)."""
    src = tmp_path / "ngp"
    (src / "images").mkdir(parents=True)
    frames = []
    for i, c2w in enumerate(orbit_poses(17)):
        frames.append({"file_path": f"images/{i:04d}.png", "transform_matrix": c2w.tolist()})
        if i != 4:
            Image.fromarray(np.full((12, 16, 3), 128, dtype=np.uint8)).save(src / frames[-1]["file_path"])
    doc = {"fl_x": 20.0, "fl_y": 21.0, "cx": 7.5, "cy": 6.25, "w": 16, "h": 12, "k1": 0.01, "p1": 0.001,
           "aabb_scale": 2, "frames": frames}  # fmt: skip
    (src / "transforms.json").write_text(json.dumps(doc))
    return src


@pytest.fixture()
def fake_ngp_root(tmp_path: Path) -> Path:
    root = tmp_path / "instant-ngp"
    (root / "build").mkdir(parents=True)
    (root / "build" / "pyngp.py").write_text(FAKE_PYNGP)
    return root


def _drive(plan: peers.Plan, root: Path, tmp_path: Path, **kw) -> subprocess.CompletedProcess:
    (tag, cmd, timeout_s), *_ = peers.ngp_commands(plan, [0.05], root, python=sys.executable, **kw)
    env = {**peers.ngp_env(), "FAKE_NGP_LOG": str(tmp_path / "fake.log")}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_dry_run_writes_our_split_and_prints_each_command(capture: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    argv = ["--scene", str(capture), "--times", "15,60", "--out", str(out), "--dry-run", "--peers",
            str(tmp_path / "no-kit"), "--", "seed=3"]  # fmt: skip
    with pytest.warns(UserWarning, match="skipped 1 of 17"):
        assert peers.main(argv) == 0
    printed = capsys.readouterr().out
    split = out / "ngp" / "split"
    test_json = json.loads((split / "transforms_test.json").read_text())
    # the 16 usable frames, every 8th held out: frames 0 and 9 of the file (8 is usable index 7)
    assert [f["file_path"] for f in test_json["frames"]] == ["images/0000.png", "images/0009.png"]
    lines = [line for line in printed.splitlines() if line.startswith("[peers] ") and "--" in line]
    ngp_lines = [line for line in lines if "ngp_driver.py" in line]
    assert len(ngp_lines) == 2 and "--seconds 15 " in ngp_lines[0] and "--seconds 60 " in ngp_lines[1]
    assert f"--train {split / 'transforms_train.json'}" in ngp_lines[0] and "--jit default" in ngp_lines[0]
    (ours,) = [line for line in lines if "nerf_lightning.bench.curve" in line]
    assert "--checkpoints 15,60 " in ours
    assert ours.endswith(f"data.path={capture} data.format=ngp data.test_every=8 logger=csv "
                         "callbacks.progress_bar=null seed=3")  # fmt: skip
    assert "LD_LIBRARY_PATH=" in ngp_lines[0]


def test_blender_layout_runs_both_programs_on_the_split_files(capture: Path, tmp_path: Path) -> None:
    with pytest.warns(UserWarning):
        plan = peers.make_plan(capture, tmp_path / "out", layout="blender")
    assert plan.work.name == "ngp-blender" and plan.ours_path == plan.split.root
    cmd = peers.ours_command(plan, [60], rate=100)
    assert f"data.path={plan.split.root}" in cmd and "data.val_split=test" in cmd
    assert "data.format=ngp" not in cmd
    # the split files are the ngp layout's: instant-ngp's runs of <scene> serve both tables
    assert plan.split.root == tmp_path / "out" / "ngp" / "split" and plan.ngp_work == tmp_path / "out" / "ngp"
    ngp_row = {"tag": "t", "seconds_target": 60, "psnr_black": 20}
    plan.ngp_work.joinpath("ngp.jsonl").write_text(json.dumps(ngp_row))
    out = peers.ours_out(plan, None, [60])
    out.mkdir(parents=True)
    (out / "curve.json").write_text(json.dumps({"points": [{"checkpoint_s": 60, "psnr": 25}]}))
    rows = peers.results(plan.work, plan.ngp_work)
    assert [(r["program"], r["psnr_ngp"], r["psnr"]) for r in rows] == [
        ("instant-ngp", 20, None), ("nerf_lightning", None, 25)
    ]


def test_driver_scores_each_view_as_instant_ngp_does(capture: Path, fake_ngp_root: Path, tmp_path: Path):
    """Against the stand-in: view i predicts sRGB 0.25 + 0.1 i against the grey 128/255 of every test
    image, so both metrics are -20 log10 |0.25 + 0.1 i - 0.50196| per view (opaque: black and white
    backgrounds agree); the views come in instant-ngp's natural-sorted order; train extrinsics is set
    before training."""
    with pytest.warns(UserWarning):
        plan = peers.make_plan(capture, tmp_path / "out")
    done = _drive(plan, fake_ngp_root, tmp_path, train_extrinsics=True)
    assert done.returncode == 0, done.stdout + done.stderr
    (row,) = [json.loads(line) for line in (plan.work / "ngp_extrinsics.jsonl").read_text().splitlines()]
    assert row["train_extrinsics"] and row["steps"] > 0 and row["n_test"] == 2 and row["aabb_scale"] == 2
    expected = [_srgb_psnr(0.25, 128 / 255), _srgb_psnr(0.35, 128 / 255)]
    assert [v["image"] for v in row["per_view"]] == ["images/0000.png", "images/0009.png"]
    for key in ("psnr_black", "psnr_srgb_white"):
        assert [v[key] for v in row["per_view"]] == pytest.approx(expected, abs=1e-4)
        assert row[key] == pytest.approx(np.mean(expected), abs=1e-4)
        assert row[key + "_min"] == pytest.approx(min(expected), abs=1e-4)
    # the 14 training views' learned offsets are baked in and zeroed before the test file is loaded
    log = (tmp_path / "fake.log").read_text().splitlines()
    assert log == [
        "load transforms_train.json extrinsics=False",
        *[f"set {i} ('pose', {i}) True" for i in range(14)],
        "load transforms_test.json extrinsics=True",
    ]


def test_driver_refuses_a_test_file_with_another_aabb_scale(capture, fake_ngp_root: Path, tmp_path: Path):
    """instant-ngp resets its network when the test file's aabb_scale differs: no number is reported."""
    with pytest.warns(UserWarning):
        plan = peers.make_plan(capture, tmp_path / "out")
    doc = json.loads(plan.split.test_json.read_text())
    doc["aabb_scale"] = 1
    plan.split.test_json.write_text(json.dumps(doc))
    done = _drive(plan, fake_ngp_root, tmp_path)
    assert done.returncode != 0 and "aabb_scale 1 differs from the training file's 2" in done.stderr
    assert not (plan.work / "ngp.jsonl").exists()


def test_the_kit_is_extracted_from_its_pieces(tmp_path: Path) -> None:
    """``cat ingp-bin.tar.xz.part* | xz -dc | tar x`` in .peers/, done by the bench when pyngp is missing."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"not really a shared object"
        info = tarfile.TarInfo("instant-ngp/build/pyngp.cpython-312-x86_64-linux-gnu.so")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    packed = lzma.compress(buf.getvalue())
    kit = tmp_path / ".peers"
    kit.mkdir()
    (kit / "ingp-bin.tar.xz.part00").write_bytes(packed[:100])
    (kit / "ingp-bin.tar.xz.part01").write_bytes(packed[100:])
    root = peers.find_ngp_root(None, kit)
    assert root == kit / "instant-ngp" and [p.name for p in root.glob("build/pyngp*.so")]
    assert peers.find_ngp_root(None, kit) == root  # found, not extracted again
    with pytest.raises(peers.UserError, match="no ingp-bin.tar.xz"):
        peers.find_ngp_root(None, tmp_path / "empty")


def test_ngp_env_puts_the_toolkit_first_and_drops_pip_cuda(tmp_path: Path) -> None:
    (tmp_path / "cuda" / "lib64").mkdir(parents=True)
    base = {"CUDA_HOME": str(tmp_path / "cuda"), "PATH": "",
            "LD_LIBRARY_PATH": "/x/site-packages/nvidia/cuda_runtime/lib:/opt/lib"}  # fmt: skip
    env = peers.ngp_env(base)
    assert env["LD_LIBRARY_PATH"] == f"{tmp_path / 'cuda'}/lib64:/opt/lib"


def test_table_puts_both_programs_and_both_metrics_side_by_side(tmp_path: Path) -> None:
    work = tmp_path / "fox"
    (work / "ours" / "60s").mkdir(parents=True)
    ngp_row = {
        "tag": "fox_60s", "seconds_target": 60.0, "train_s": 60.0, "steps": 8400, "steps_per_s": 140.0,
        "psnr_srgb_white": 21.40, "psnr_black": 21.41,
        "per_view": [{"image": "images/0001.png", "psnr_srgb_white": 15.3, "psnr_black": 15.31},
                     {"image": "images/0012.png", "psnr_srgb_white": 27.5, "psnr_black": 27.51}],
    }  # fmt: skip
    earlier = {**ngp_row, "psnr_srgb_white": 0.0}
    (work / "ngp.jsonl").write_text(json.dumps(earlier) + "\n" + json.dumps(ngp_row))
    point = {
        "checkpoint_s": 60.0, "train_s": 61.0, "steps": 15000, "steps_per_s": 245.9, "psnr": 29.35,
        "psnr_ngp": 29.30,
        "per_view": {"view": [0, 1], "image": ["0001.jpg", "0012.jpg"], "psnr": [27.0, 31.7],
                     "psnr_ngp": [26.9, 31.7]},
    }  # fmt: skip
    (work / "ours" / "60s" / "curve.json").write_text(json.dumps({"points": [point]}))
    rows = peers.results(work)
    assert [r["program"] for r in rows] == ["instant-ngp", "nerf_lightning"]
    assert rows[0]["psnr"] == 21.40  # the last line of a tag wins
    text = peers.table(rows, "fox")
    assert "| 60 | instant-ngp | 60.0 | 8400 | 140.0 | 21.40 | 21.41 | 0001 15.30 |" in text
    ours = "| 60 | nerf_lightning | 61.0 | 15000 | 245.9 | 29.35 (+7.95) | 29.30 (+7.89) | 0001 27.00 |"
    assert ours in text
    assert "| 0001 | 15.30 / 15.31 | 27.00 / 26.90 |" in text
    assert "| 0012 | 27.50 / 27.51 | 31.70 / 31.70 |" in text


def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        peers.main(["--scene", "no-such-scene", "--data", str(tmp_path), "--dry-run"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("error: --scene no-such-scene: no capture folder")


def test_the_suite_reads_the_rows_of_its_own_call(
    capture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--json``: only the rows of the programs and time points of this call (the folder holds
    earlier ones too), one suite row each with both metrics; the table keeps everything."""
    out = tmp_path / "out"
    with pytest.warns(UserWarning):
        plan = peers.make_plan(capture, out)
    earlier = {"tag": "ngp_60s", "seconds_target": 60.0, "psnr_srgb_white": 21.4, "psnr_black": 21.41}
    plan.ngp_work.joinpath("ngp.jsonl").write_text(json.dumps(earlier) + "\n")
    views = {"image": ["0000.png", "0009.png"], "psnr": [28.0, 30.0]}
    points = {t: {"checkpoint_s": t, "psnr": 29.0 + t / 60, "psnr_ngp": 28.9 + t / 60, "steps": 100 * t,
                  "per_view": views} for t in (15.0, 60.0)}
    _write_curve(peers.ours_out(plan, None, [15]), points[15.0])  # an earlier call's point
    ran = []

    def run(cmd: list[str], timeout_s: float, log: Path, env=None) -> int:  # bench.curve's file, at --out
        ran.append(cmd)
        _write_curve(Path(cmd[cmd.index("--out") + 1]), points[60.0])
        return 0

    monkeypatch.setattr(peers, "_run", run)
    run_dir = tmp_path / "run"
    argv = ["--scene", str(capture), "--out", str(out), "--times", "60", "--programs", "ours",
            "--json", str(run_dir / "peers.json")]  # fmt: skip
    with pytest.warns(UserWarning):
        assert peers.main(argv) == 0
    assert len(ran) == 1 and "nerf_lightning.bench.curve" in ran[0]
    table = (plan.work / "peers.md").read_text()
    assert "| 60 | instant-ngp |" in table and "| 15 | nerf_lightning |" in table  # and the earlier call
    (row,) = readers.peers_json(run_dir, run_dir / "log")  # the call's rows: ours at 60 s only
    assert row["part"] == "@nerf_lightning_60s"
    assert (row["psnr"], row["psnr_ngp"], row["steps"]) == (30.0, 29.9, 6000)
    assert row["note"] == "nerf_lightning; worst view 0000 28.00 dB"


def _write_curve(folder: Path, *points: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "curve.json").write_text(json.dumps({"points": list(points)}))


def test_calls_at_other_times_add_rows_and_a_time_measured_again_shows_its_newest_run(tmp_path: Path) -> None:
    work = tmp_path / "fox"
    first = [{"checkpoint_s": 15.0, "psnr": 29.4}, {"checkpoint_s": 60.0, "psnr": 30.3}]
    _write_curve(work / "ours" / "15_60s", *first)
    _write_curve(work / "ours" / "300s", {"checkpoint_s": 300.0, "psnr": 29.9})
    _write_curve(work / "ours-jitter" / "60s", {"checkpoint_s": 60.0, "psnr": 30.0})
    _write_curve(work / "ours" / "60s", {"checkpoint_s": 60.0, "psnr": 30.1})  # written last: the newest
    os.utime(work / "ours" / "15_60s" / "curve.json", ns=(1, 1))  # however the names sort
    rows = peers.results(work)
    assert [(r["program"], r["checkpoint_s"], r["psnr"]) for r in rows] == [
        ("nerf_lightning", 15.0, 29.4), ("nerf_lightning", 60.0, 30.1), ("nerf_lightning", 300.0, 29.9),
        ("nerf_lightning (jitter)", 60.0, 30.0),
    ]
