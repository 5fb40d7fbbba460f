"""Side by side with instant-ngp: the same GPU, the same views, both metrics, one table.

    python -m benchmarks.peers --scene fox --times 15,60 [--programs ngp,ours]
        [--layout auto|blender] [--ngp-train-extrinsics] [--label NAME] [--out DIR] [--dry-run]
        [--] [nerf_lightning train overrides ...]

For one capture (``--scene``: ``lego``, ``fox``, ``fruit`` looked up under ``--data``, or a path):

1. **Split files.** Both programs must train and test on the same views. A capture without split files
   (fox, fruit) gets ``transforms_train.json`` / ``transforms_test.json`` written with exactly the
   hold-out of ``data.format=ngp data.test_every=N`` (``data/split_files.py``: every Nth usable frame in
   file order; frames whose image is missing are not usable); a capture with split files (lego) is
   copied. Images are written as PNG from the pixels this project decodes, so instant-ngp (which reads
   no WebP and has its own JPEG decoder) sees the same pixels. Folder: ``<out>/<scene>/split``.
2. **instant-ngp** (``--programs`` has ``ngp``), alone on the GPU, one fresh run per time point:
   ``benchmarks/ngp_driver.py`` (the metric of instant-ngp's ``scripts/run.py``, per-view PSNRs,
   ``--ngp-train-extrinsics``), or with ``--ngp-runner kit`` the kit's own ``run_scene.sh`` (means only).
3. **nerf_lightning** (``--programs`` has ``ours``): ``bench.curve`` at the same time points, on the
   original capture with ``data.format=ngp`` (captures without split files) or on the capture's split
   files with ``data.val_split=test``; ``--layout blender`` trains this project on the written split
   files instead (a real capture in the Blender layout that COLMAP converters write; results and
   table in ``<out>/<scene>-blender``) beside instant-ngp's runs of ``<out>/<scene>``, which trained
   on the same files.
4. **One table** (printed, and ``<out>/<scene>/peers.md`` + ``peers.json``): per time point and
   program the steps, steps/s, PSNR in sRGB over white (the project's headline metric) and instant-ngp's
   own (``psnr_black``; ``val/psnr_ngp`` for this project, ``models/metrics.py``), the worst view, and
   the per-view PSNRs of both programs side by side. Results of earlier calls in the same folder are
   reused (instant-ngp's runs append to ``ngp.jsonl``; each invocation for this project writes
   ``ours[-LABEL]/<times>s/curve.json``; a time point measured again shows its newest run), so
   ``--programs ours --label before -- data.pixel_jitter=false`` adds a row to an existing table
   without running instant-ngp again, and ``--times 15`` then ``--times 300`` in two calls (one
   300 s run of each program fills most of a 10-minute machine slot) make one table.

instant-ngp comes from the peers kit (``../shared/peers``) copied into the git-ignored ``.peers/`` of
the repository root, carried to the GPU machine with the call: ``--ngp-root`` (default
``.peers/instant-ngp``) must hold ``build/pyngp*.so``; when it does not and ``.peers/`` holds
``ingp-bin.tar.xz.part*`` (or ``ingp-bin.tar.xz``), they are extracted into ``.peers/`` first (the
same as ``cat ingp-bin.tar.xz.part* | xz -dc | tar x`` there). The driver runs with ``--ngp-python``
(default: this Python, which pyngp must have been built for) and ``LD_LIBRARY_PATH`` starting with
the CUDA toolkit's ``lib64`` and without pip's ``nvidia-*`` libraries (a second CUDA runtime crashes
pyngp).

``--dry-run`` writes the split files and prints every command without running it (also on a CPU).
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nerf_lightning.bench.curve import split_overrides
from nerf_lightning.data.split_files import SplitFiles, copy_split_files, write_split_files
from nerf_lightning.errors import UserError, user_errors
from nerf_lightning.utils.io import atomic_write_bytes, atomic_write_json

__all__ = ["Plan", "main", "make_plan", "ngp_commands", "ours_command", "results", "table"]

#: where ``--scene NAME`` is looked up, in order (the GPU machine carries ``.devdata``)
DATA_ROOTS = (".devdata", "../shared/data", "shared/data", "../../shared/data")
PEERS_DIR = Path(".peers")
#: per scene: the first guess of this project's steps/s (``bench.curve --rate``) and its own overrides
SCENES: dict[str, dict[str, Any]] = {
    "lego": {"rate": 340.0, "overrides": ["experiment=blender"]},
    "lego_official": {"rate": 340.0, "overrides": ["experiment=blender"]},
    "fox": {"rate": 300.0, "overrides": []},
    "fruit": {"rate": 270.0, "overrides": []},
}
DEFAULT_RATE = 250.0
#: seconds a run may take beyond its training time (loading, JIT compile, evaluation) before it is killed
NGP_SLACK_S = 180
OURS_SLACK_S = 240


@dataclass
class Plan:
    """What one call runs: the capture, its split files and each program's inputs.

    Attributes:
        scene: the scene's name (a folder name for a path).
        capture: the capture folder.
        work: this project's results and the table (``<out>/<scene>``, ``<out>/<scene>-blender``).
        ngp_work: instant-ngp's results (``<out>/<scene>``: the Blender layout of a capture without
            split files has the same split files, so instant-ngp's runs serve both).
        split: the split files both programs share.
        ours_path, ours_overrides: ``data.path`` and the data overrides of this project's runs.
    """

    scene: str
    capture: Path
    work: Path
    ngp_work: Path
    split: SplitFiles
    ours_path: Path
    ours_overrides: list[str] = field(default_factory=list)


def resolve_capture(scene: str, roots: Sequence[str | Path] = DATA_ROOTS) -> Path:
    """A scene name looked up under ``roots`` (first hit), or a capture path."""
    path = Path(scene).expanduser()
    if path.is_dir():
        return path
    for root in roots:
        candidate = Path(root) / scene
        if candidate.is_dir():
            return candidate
    raise UserError(f"--scene {scene}: no capture folder {scene!r} under {', '.join(map(str, roots))}")


def make_plan(
    capture: Path, out: Path, layout: str = "auto", test_every: int = 8, scene: str | None = None
) -> Plan:
    """Write the split files and decide each program's inputs (see the module docstring); every path
    in the plan is absolute (the runs may start in other folders)."""
    capture, out = capture.resolve(), out.resolve()
    name = scene or capture.name
    has_split = (capture / "transforms_train.json").is_file() and (capture / "transforms_test.json").is_file()
    work = out / name
    if has_split:
        split = copy_split_files(capture, work / "split")
        return Plan(name, capture, work, work, split, capture, ["data.val_split=test"])
    split = write_split_files(capture, work / "split", test_every=test_every)
    if layout == "blender":  # both programs on the written split files: the Blender-layout real capture
        return Plan(name, capture, out / f"{name}-blender", work, split, split.root, ["data.val_split=test"])
    return Plan(
        name, capture, work, work, split, capture, ["data.format=ngp", f"data.test_every={test_every}"]
    )


# ---------------------------------------------------------------------------------------- instant-ngp
def find_ngp_root(ngp_root: Path | None, peers: Path = PEERS_DIR, extract: bool = True) -> Path:
    """The instant-ngp folder holding ``build/pyngp*.so``; extracts the kit's ``ingp-bin.tar.xz`` pieces
    found in ``peers`` into ``peers`` when it is missing (and ``extract``)."""
    root = ngp_root or peers / "instant-ngp"
    if list(root.glob("build/pyngp*.so")) or not extract:
        return root
    parts = sorted(peers.glob("ingp-bin.tar.xz.part*")) or sorted(peers.glob("ingp-bin.tar.xz"))
    if not parts:
        raise UserError(
            f"{root}: no build/pyngp*.so, and no ingp-bin.tar.xz(.partNN) in {peers} to extract it from; "
            "copy ../shared/peers into .peers/ (git-ignored) and carry it"
        )
    with tempfile.TemporaryFile() as joined:
        for part in parts:
            with part.open("rb") as f:
                shutil.copyfileobj(f, joined)
        joined.seek(0)
        with lzma.open(joined) as xz, tarfile.open(fileobj=xz, mode="r|") as tar:
            tar.extractall(peers, filter="tar")
    if not list(root.glob("build/pyngp*.so")):
        raise UserError(f"{root}: no build/pyngp*.so after extracting {parts[0].name} into {peers}")
    return root


def cuda_home(env: Mapping[str, str]) -> str:
    """The CUDA toolkit whose ``lib64`` pyngp loads: ``$CUDA_HOME``, the one of ``nvcc`` on ``PATH``,
    ``/usr/local/cuda`` or ``/usr/local/cuda-13.0``, the first with a ``lib64`` folder."""
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    candidates = [env.get("CUDA_HOME"), str(Path(nvcc).resolve().parent.parent) if nvcc else None]
    for c in [*candidates, "/usr/local/cuda", "/usr/local/cuda-13.0"]:
        if c and (Path(c) / "lib64").is_dir():
            return c
    return "/usr/local/cuda"


def ngp_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's environment: the toolkit's ``lib64`` first on ``LD_LIBRARY_PATH``, pip's
    ``nvidia-*`` library folders removed (a second libcudart / libnvrtc crashes pyngp)."""
    env = dict(os.environ if base is None else base)
    pip_cuda = re.compile(r"/nvidia/[^/]+/lib")
    kept = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p and not pip_cuda.search(p)]
    env["LD_LIBRARY_PATH"] = ":".join([f"{cuda_home(env)}/lib64", *kept])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def ngp_jsonl(work: Path, train_extrinsics: bool) -> Path:
    return work / ("ngp_extrinsics.jsonl" if train_extrinsics else "ngp.jsonl")


def ngp_commands(
    plan: Plan,
    times: Sequence[float],
    root: Path,
    python: str = sys.executable,
    jit: str = "default",
    train_extrinsics: bool = False,
) -> list[tuple[str, list[str], int]]:
    """One ``(tag, command, timeout_s)`` per time point: a fresh instant-ngp run each."""
    driver = Path(__file__).with_name("ngp_driver.py")
    out = ngp_jsonl(plan.ngp_work, train_extrinsics)
    runs = []
    for t in times:
        tag = f"{plan.scene}_{t:g}s" + ("_extrinsics" if train_extrinsics else "")
        cmd = [
            python, str(driver), "--train", str(plan.split.train_json), "--test", str(plan.split.test_json),
            "--seconds", f"{t:g}", "--root", str(root), "--jit", jit, "--out", str(out), "--tag", tag,
        ]  # fmt: skip
        if train_extrinsics:
            cmd.append("--train-extrinsics")
        runs.append((tag, cmd, int(t) + NGP_SLACK_S))
    return runs


def kit_command(
    plan: Plan, times: Sequence[float], root: Path, peers: Path = PEERS_DIR
) -> tuple[list[str], dict]:
    """The kit's ``run_scene.sh`` on the split files (``JIT=default``), results in ``<work>/ngp_kit``."""
    env = {
        "JIT": "default", "TIMES": " ".join(f"{t:g}" for t in times), "NGP_ROOT": str(root.resolve()),
        "OUT": str((plan.ngp_work / "ngp_kit").resolve()), "NAME": plan.scene,
    }  # fmt: skip
    return ["bash", str(peers / "run_scene.sh"), str(plan.split.root)], env


# ------------------------------------------------------------------------------------- nerf_lightning
def ours_dir(plan: Plan, label: str | None) -> Path:
    """This project's results of one variant (``--label``): one ``curve.json`` per call, in
    :func:`ours_out`, so that calls at other time points add to the table instead of replacing it."""
    return plan.work / (f"ours-{label}" if label else "ours")


def ours_out(plan: Plan, label: str | None, times: Sequence[float]) -> Path:
    """Where one call's ``bench.curve`` writes: ``<ours_dir>/15_300s`` for ``--times 15,300``."""
    return ours_dir(plan, label) / ("_".join(f"{t:g}" for t in times) + "s")


def ours_command(
    plan: Plan,
    times: Sequence[float],
    rate: float,
    overrides: Sequence[str] = (),
    label: str | None = None,
    python: str = sys.executable,
    tolerance: float = 0.1,
) -> list[str]:
    """``bench.curve`` at the time points on the plan's capture, the scene's own overrides first. A run
    more than ``tolerance`` (a fraction) off its time is repeated once at the measured rate: instant-ngp
    trains exactly the time."""
    scene_overrides = SCENES.get(plan.scene, {}).get("overrides", [])
    return [
        python, "-m", "nerf_lightning.bench.curve", "--checkpoints", ",".join(f"{t:g}" for t in times),
        "--rate", f"{rate:g}", "--tolerance", f"{tolerance:g}", "--out", str(ours_out(plan, label, times)),
        "--label", label or "nerf_lightning", "--",
        *scene_overrides, f"data.path={plan.ours_path}", *plan.ours_overrides,
        "logger=csv", "callbacks.progress_bar=null", *overrides,
    ]  # fmt: skip


# ---------------------------------------------------------------------------------------------- table
def _last_by_tag(path: Path) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row.get("tag", "")] = row
    return rows


def _stem(name: str) -> str:
    return Path(str(name)).stem


def results(work: Path, ngp_work: Path | None = None) -> list[dict[str, Any]]:
    """Every program's points found in ``work``: ``{program, checkpoint_s, train_s, steps, steps_per_s,
    psnr, psnr_ngp, per_view: {image stem: (psnr, psnr_ngp)}, worst: (stem, pair) | None, source: the
    results file}``, where
    ``psnr`` is sRGB over white and ``psnr_ngp`` instant-ngp's run.py metric; instant-ngp's (from
    ``ngp_work``, default ``work``) first."""
    ngp_work = work if ngp_work is None else ngp_work
    rows: list[dict[str, Any]] = []
    ngp_sources = [
        ("instant-ngp", ngp_work / "ngp.jsonl"),
        ("instant-ngp, train extrinsics", ngp_work / "ngp_extrinsics.jsonl"),
        ("instant-ngp (kit)", ngp_work / "ngp_kit" / "ngp_eval.jsonl"),
    ]
    for program, path in ngp_sources:
        for r in _last_by_tag(path).values():
            views = {
                _stem(v["image"]): (v["psnr_srgb_white"], v["psnr_black"]) for v in r.get("per_view", [])
            }
            point = (r.get("seconds_target"), r.get("psnr_srgb_white"), r.get("psnr_black"))
            rows.append(_row(program, path, r, *point, views))
    for folder in sorted(p for p in work.glob("ours*") if p.is_dir()):
        label = folder.name[len("ours-") :] if folder.name != "ours" else ""
        program = f"nerf_lightning ({label})" if label else "nerf_lightning"
        # every call's curve.json, oldest first: a time point measured again takes the newest run
        curves = sorted(folder.glob("*/curve.json"), key=lambda c: c.stat().st_mtime_ns)
        latest: dict[float, tuple[Path, dict[str, Any]]] = {}
        for curve in curves:
            for pt in json.loads(curve.read_text()).get("points", []):
                latest[float(pt.get("checkpoint_s") or -1)] = (curve, pt)
        for _, (curve, pt) in sorted(latest.items()):
            per_view = pt.get("per_view") or {}
            names = per_view.get("image") or [str(v) for v in per_view.get("view", [])]
            ngp = per_view.get("psnr_ngp") or [None] * len(names)
            views = {_stem(n): (a, b) for n, a, b in zip(names, per_view.get("psnr", []), ngp, strict=False)}
            point = (pt.get("checkpoint_s"), pt.get("psnr"), pt.get("psnr_ngp"))
            rows.append(_row(program, curve, pt, *point, views))
    return rows


def _row(
    program: str,
    source: Path,
    r: dict[str, Any],
    checkpoint_s: Any,
    psnr: Any,
    psnr_ngp: Any,
    views: dict[str, tuple],
) -> dict[str, Any]:
    scored = {k: v for k, v in views.items() if v[0] is not None}
    return {
        "program": program,
        "source": str(source),
        "checkpoint_s": checkpoint_s,
        "train_s": r.get("train_s"),
        "steps": r.get("steps"),
        "steps_per_s": r.get("steps_per_s"),
        "psnr": psnr,
        "psnr_ngp": psnr_ngp,
        "per_view": views,
        "worst": min(scored.items(), key=lambda kv: kv[1][0]) if scored else None,
    }


def _f(value: Any, fmt: str = "{:.2f}") -> str:
    if isinstance(value, (int, float)) and math.isfinite(float(value)):
        return fmt.format(value)
    return "-"


def table(rows: list[dict[str, Any]], scene: str) -> str:
    """The markdown table of :func:`results` (means per time point and program, the difference to
    instant-ngp, then the per-view PSNRs)."""
    lines = [
        f"### {scene}: nerf_lightning and instant-ngp, same GPU, same views",
        "",
        "| T [s] | program | trained [s] | steps | steps/s | PSNR sRGB over white "
        "| PSNR instant-ngp's (run.py) | worst view (sRGB/white) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    times = sorted({float(r["checkpoint_s"]) for r in rows if r["checkpoint_s"] is not None})
    for t in times:
        at = [r for r in rows if r["checkpoint_s"] is not None and float(r["checkpoint_s"]) == t]
        ngp = next((r for r in at if r["program"] == "instant-ngp"), None)
        for r in at:
            # each metric with its difference to instant-ngp's run at the same time point
            psnr, psnr_ngp = (_f(r[key]) + _diff(r, ngp, key) for key in ("psnr", "psnr_ngp"))
            worst = f"{r['worst'][0]} {r['worst'][1][0]:.2f}" if r["worst"] else "-"
            lines.append(
                f"| {t:g} | {r['program']} | {_f(r['train_s'], '{:.1f}')} | {_f(r['steps'], '{:.0f}')} "
                f"| {_f(r['steps_per_s'], '{:.1f}')} | {psnr} | {psnr_ngp} | {worst} |"
            )
    with_views = [r for r in rows if r["per_view"]]
    if with_views:
        lines += ["", "Per view (PSNR sRGB over white / instant-ngp's):", ""]
        heads = [f"{r['program']} {float(r['checkpoint_s']):g} s" for r in with_views]
        lines.append("| view | " + " | ".join(heads) + " |")
        lines.append("| --- |" + " ---: |" * len(heads))
        views = sorted({v for r in with_views for v in r["per_view"]}, key=_natural)
        for v in views:
            cells = []
            for r in with_views:
                pair = r["per_view"].get(v)
                cells.append(f"{_f(pair[0])} / {_f(pair[1])}" if pair else "-")
            lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _diff(row: dict[str, Any], ngp: dict[str, Any] | None, key: str) -> str:
    """`` (+1.23)``: ``row[key]`` minus instant-ngp's at the same time point ('' for instant-ngp itself)."""
    if ngp is None or row is ngp or row.get(key) is None or ngp.get(key) is None:
        return ""
    return f" ({float(row[key]) - float(ngp[key]):+.2f})"


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


# ----------------------------------------------------------------------------------------------- main
def _run(cmd: list[str], timeout_s: int, log: Path, env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` with its output in ``log``; a run past ``timeout_s`` is killed (rc 124)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[peers] {shlex.join(cmd)}  > {log}", flush=True)
    with log.open("w") as f:
        try:
            return subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, env=env
            ).returncode
        except subprocess.TimeoutExpired:
            return 124


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module docstring); bad input exits 2 with one ``error:`` line."""
    with user_errors():
        return _main(sys.argv[1:] if argv is None else argv)


def _main(argv: list[str]) -> int:
    argv, overrides = split_overrides(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scene", required=True, help="lego | fox | fruit (under --data) or a capture folder")
    p.add_argument("--times", default="15,60", help="seconds of training, comma-separated (e.g. 15,60,300)")
    p.add_argument("--programs", default="ngp,ours", help="which to run: ngp, ours or both")
    p.add_argument(
        "--layout",
        choices=("auto", "blender"),
        default="auto",
        help="blender: both programs on written Blender split files (captures without them)",
    )
    p.add_argument("--data", default=",".join(DATA_ROOTS), help="folders --scene names are looked up in")
    p.add_argument("--out", type=Path, default=Path("outputs/bench/peers"))
    p.add_argument("--test-every", type=int, default=8)
    p.add_argument("--label", default=None, help="name of this project's row (a variant of its config)")
    p.add_argument("--rate", type=float, default=None, help="first guess of this project's steps/s")
    p.add_argument("--peers", type=Path, default=PEERS_DIR, help="the peers kit (git-ignored copy)")
    p.add_argument("--ngp-root", type=Path, default=None, help="instant-ngp folder with build/pyngp*.so")
    p.add_argument("--ngp-runner", choices=("driver", "kit"), default="driver")
    p.add_argument("--ngp-python", default=sys.executable)
    p.add_argument("--ngp-train-extrinsics", action="store_true", help="instant-ngp optimizes training poses")
    p.add_argument("--jit", choices=("default", "on", "off"), default="default")
    p.add_argument("--dry-run", action="store_true", help="write the split files, print the commands")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here (benchmarks.suite)")
    args = p.parse_args(argv)
    times = [float(t) for t in args.times.split(",") if t]
    programs = {x.strip() for x in args.programs.split(",") if x.strip()}
    if not times or not programs <= {"ngp", "ours"}:
        raise UserError(
            f"--times {args.times!r} / --programs {args.programs!r}: expected seconds and ngp/ours"
        )
    capture = resolve_capture(args.scene, [r for r in args.data.split(",") if r])
    plan = make_plan(capture, args.out, args.layout, args.test_every, scene=Path(args.scene).name)
    print(
        f"[peers] {plan.scene}: {len(plan.split.train)} train / {len(plan.split.test)} test views; split "
        f"files in {plan.split.root}; nerf_lightning on data.path={plan.ours_path} "
        + " ".join(plan.ours_overrides)
    )
    failed = []
    written: list[Path] = []  # the results files of this call's programs
    if "ngp" in programs:
        root = find_ngp_root(args.ngp_root, args.peers, extract=not args.dry_run)
        if args.ngp_runner == "kit":
            cmd, kit_env = kit_command(plan, times, root, args.peers)
            written.append(plan.ngp_work / "ngp_kit" / "ngp_eval.jsonl")
            if args.dry_run:
                print(
                    "[peers] "
                    + " ".join(f"{k}={shlex.quote(v)}" for k, v in kit_env.items())
                    + " "
                    + shlex.join(cmd)
                )
            else:
                budget = int(sum(times)) + NGP_SLACK_S * len(times)
                env = {**os.environ, **kit_env}
                if _run(cmd, budget, plan.ngp_work / "logs" / "ngp_kit.log", env) != 0:
                    failed.append("ngp_kit")
        else:
            env = ngp_env()
            written.append(ngp_jsonl(plan.ngp_work, args.ngp_train_extrinsics))
            for tag, cmd, timeout_s in ngp_commands(
                plan, times, root, args.ngp_python, args.jit, args.ngp_train_extrinsics
            ):
                if args.dry_run:
                    print(f"[peers] LD_LIBRARY_PATH={shlex.quote(env['LD_LIBRARY_PATH'])} {shlex.join(cmd)}")
                elif _run(cmd, timeout_s, plan.ngp_work / "logs" / f"{tag}.log", env) != 0:
                    failed.append(tag)
    if "ours" in programs:
        rate = args.rate or SCENES.get(plan.scene, {}).get("rate", DEFAULT_RATE)
        cmd = ours_command(plan, times, rate, overrides, args.label)
        written.append(ours_out(plan, args.label, times) / "curve.json")
        if args.dry_run:
            print(f"[peers] {shlex.join(cmd)}")
        else:
            budget = int(2 * sum(times)) + OURS_SLACK_S * len(times)
            if _run(cmd, budget, plan.work / "logs" / f"{ours_dir(plan, args.label).name}.log") != 0:
                failed.append(ours_dir(plan, args.label).name)
    if args.dry_run:
        return 0
    rows = results(plan.work, plan.ngp_work)
    text = table(rows, plan.scene)
    atomic_write_bytes(plan.work / "peers.md", text.encode())
    atomic_write_json(
        plan.work / "peers.json", {"scene": plan.scene, "capture": str(plan.capture), "rows": rows}
    )
    print("\n" + text)
    if args.json is not None:
        sources = {str(p) for p in written}
        mine = [r for r in rows if r["source"] in sources and float(r["checkpoint_s"] or -1) in times]
        atomic_write_json(args.json, {"scene": plan.scene, "capture": str(plan.capture), "rows": mine})
    if failed:
        print(f"[peers] failed (see {plan.work / 'logs'}): {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
