"""Captures bigger than one GPU: the bytes each rank holds under ``data.shard`` and the cost of
``data.storage=host``.

    python -m benchmarks.big_captures memory [--views 48 --width 320 --height 240] [--root DIR]
    python -m benchmarks.big_captures overhead [--steps 60 --rounds 3] [-- train overrides ...]
    python -m benchmarks.big_captures generate --gb 20|auto [--views 160 --width 2000 --height 1500]
        [--root DIR] [--json FILE]
    python -m benchmarks.big_captures curve [bench.curve's arguments]
    python -m benchmarks.big_captures summarize OUT [--logs DIR]

``memory``: a generated capture (``ensure_large_capture``) loaded as the ranks of N = 1, 2, 4 load it
(``data/training_pixels.TrainingPixels``: the real split, the real decoding); per N the training bytes
each rank holds (largest and smallest rank), the views per rank, and the largest rank's share of N = 1.

``overhead``: the CPU preset trained ``--steps`` steps with ``data.storage=device`` and ``host``,
alternating, ``--rounds`` times each; steps/s of the training loop (``time/train_s``) and the ratio
host / device per round (the machine's noise moves both alike within a round).

``generate``: ``ensure_large_capture`` with as many rounds (``repeat``) of ``--views`` renders as make at
least ``--gb`` GB of training pixels (``data.test_every=8`` holds out 1/8); prints the capture's folder
last (the GPU script, ``benchmarks/big_captures_gpu.sh``, reads it) and writes its sizes to ``--json``.
``--gb auto``: a capture that ``data.storage=auto`` puts on the host on this GPU (:func:`auto_gb`).

``curve``: ``nerf_lightning.bench.curve`` with the data module's log lines on stderr, so the run's log
holds the choice of ``data.storage`` with the sizes it was made from (the training bytes, the free device
memory).

``summarize``: the GPU script's table: each run's ``bench.curve`` point (steps/s, PSNR), host over device
per capture, and the choice ``data.storage=auto`` makes for each capture, from the sizes the runs logged
(``data/host_pixels.resolve_storage``: the training bytes against the free device memory).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from nerf_lightning.data.formats import load_capture
from nerf_lightning.data.heldout import capture_camera_model
from nerf_lightning.data.synthetic import ensure_large_capture
from nerf_lightning.data.training_pixels import TrainingPixels
from nerf_lightning.training.feedback import TrainingFeedback
from nerf_lightning.utils.io import atomic_write_json

WORLDS = (1, 2, 4)


def memory(path: Path, cache_dir: Path, worlds: tuple[int, ...] = WORLDS) -> list[dict[str, Any]]:
    """Per world size N: each rank's training pixels as ``TrainingPixels.load(rank, N)`` decodes them."""
    capture = load_capture(path, test_every=8)
    decode = {"downscale": 1, "num_workers": 2, "cache_dir": cache_dir}
    rows = []
    for world in worlds:
        held = []
        for rank in range(world):
            pixels = TrainingPixels(
                capture.train,
                decode,
                capture_camera_model(capture),
                TrainingFeedback(),
                path,
                shard=True,
                storage="auto",
                storage_fraction=0.5,
            )
            pixels.load(rank, world)
            held.append((pixels.nbytes, len(pixels.held_views)))
        rows.append({
            "world": world, "max_bytes": max(b for b, _ in held), "min_bytes": min(b for b, _ in held),
            "views": [v for _, v in held], "train_views": len(capture.train),
        })  # fmt: skip
    whole = rows[0]["max_bytes"]
    for row in rows:
        row["share_of_one"] = row["max_bytes"] / whole
    return rows


def memory_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| ranks N | training bytes per rank (largest / smallest) | views per rank | largest rank / N=1 |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        views = "/".join(map(str, r["views"]))
        lines.append(f"| {r['world']} | {r['max_bytes'] / 1e6:.2f} / {r['min_bytes'] / 1e6:.2f} MB | "
                     f"{views} of {r['train_views']} | {r['share_of_one']:.3f} |")  # fmt: skip
    return "\n".join(lines)


def overhead(steps: int, rounds: int, extra: list[str], out_root: Path) -> list[dict[str, Any]]:
    """Alternating ``data.storage=device`` / ``host`` runs of the CPU preset: steps/s of each."""
    from hydra.core.global_hydra import GlobalHydra

    from nerf_lightning.apps.train import train
    from nerf_lightning.run.config import compose_train_config

    rows = []
    for i in range(rounds):
        row: dict[str, Any] = {"round": i}
        for storage in ("device", "host"):
            overrides = ["experiment=cpu", "accelerator=cpu", "logger=none", "callbacks.progress_bar=null",
                         f"trainer.max_steps={steps}", "callbacks.model_checkpoint=null",
                         "model.save_val_images=false", f"data.storage={storage}", *extra]  # fmt: skip
            try:
                metrics = train(compose_train_config(overrides, out_root / f"r{i}-{storage}"))
            finally:
                GlobalHydra.instance().clear()
            row[storage] = metrics["steps"] / metrics["time/train_s"]
            row[f"{storage}_psnr"] = metrics["val/psnr"]
        row["host_over_device"] = row["host"] / row["device"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def draw_overhead(scene: Path, rays: int, draws: int, rounds: int) -> list[dict[str, Any]]:
    """ms per training batch of ``rays`` rays (``NeRFDataModule.train_batch``), device against host
    storage, alternating in blocks of ``draws`` draws."""
    import torch

    from nerf_lightning.data.datamodule import NeRFDataModule

    modules = {}
    for storage in ("device", "host"):
        dm = NeRFDataModule(path=str(scene), batch_size=rays, storage=storage, cache_dir=str(scene / "cache"))
        dm.setup("fit")
        dm.ensure_device(torch.device("cpu"))
        modules[storage] = dm
    rows = []
    for i in range(rounds):
        row: dict[str, Any] = {"round": i}
        for storage, dm in modules.items():
            t0 = time.perf_counter()
            for _ in range(draws):
                dm.train_batch(rays)
            row[f"{storage}_ms"] = (time.perf_counter() - t0) / draws * 1e3
        rows.append(row)
    return rows


def overhead_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| round | device steps/s | host steps/s | host / device | PSNR device / host |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['round']} | {r['device']:.2f} | {r['host']:.2f} | {r['host_over_device']:.3f} | "
                     f"{r['device_psnr']:.2f} / {r['host_psnr']:.2f} dB |")  # fmt: skip
    return "\n".join(lines)


def generate(gb: float, views: int, width: int, height: int, root: Path) -> dict[str, Any]:
    """The smallest ``repeat`` of ``views`` renders whose training frames (7/8) hold ``gb`` GB."""
    per_round = views * width * height * 4 * 7 / 8  # RGBA uint8 training bytes of one round
    repeat = max(1, math.ceil(gb * 1e9 / per_round))
    t0 = time.perf_counter()
    path = ensure_large_capture(root, views, width, height, repeat=repeat)
    return {
        "path": str(path.resolve()), "views": views, "width": width, "height": height, "repeat": repeat,
        "frames": views * repeat, "train_bytes": int(per_round * repeat), "seconds": time.perf_counter() - t0,
    }  # fmt: skip


#: ``data.storage_fraction``'s default: auto keeps the pixels on the device up to this share of free memory
FRACTION = 0.5


def auto_gb(free_bytes: int, ram_bytes: int, margin: float = 1.1, ram_share: float = 0.33) -> float:
    """GB of training pixels that ``data.storage=auto`` puts on the host (``margin`` x its limit, a
    ``FRACTION`` of ``free_bytes``), but at most ``ram_share`` of the host's memory: host storage holds
    the pixels twice while it pins them (a pageable and a pinned copy), and the run decodes them first."""
    return min(margin * FRACTION * free_bytes, ram_share * ram_bytes) / 1e9


def machine_memory() -> tuple[int, int]:
    """(free bytes of the first GPU, 0 without one; the host's physical memory in bytes)."""
    import torch

    free = torch.cuda.mem_get_info(0)[0] if torch.cuda.is_available() else 0
    return int(free), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


_STORAGE_LOG = re.compile(
    r"data\.storage=(\w+): (\w+) \(([\d.]+) MB of training pixels; ([\d.]+) of ([\d.]+) MB free"
)


def auto_choice(log: str, fraction: float = FRACTION) -> dict[str, Any] | None:
    """What ``data.storage=auto`` would choose for a run whose log has resolve_storage's line (on a GPU)."""
    m = _STORAGE_LOG.search(log)
    if m is None:
        return None
    mb, free = float(m.group(3)), float(m.group(4))
    return {"train_mb": mb, "free_mb": free, "limit_mb": fraction * free,
            "auto": "device" if mb <= fraction * free else "host"}  # fmt: skip


def summarize(out: Path, logs: Path | None = None) -> dict[str, Any]:
    """The GPU script's summary from OUT/<run>.json (bench.curve's curve.json), OUT/steps.tsv and the runs'
    logs (``logs/<run>.log``)."""
    summary: dict[str, Any] = {"steps": {}, "runs": {}, "auto": {}}
    steps = out / "steps.tsv"
    for line in steps.read_text().splitlines() if steps.is_file() else []:
        name, rc, secs = line.split("\t")
        summary["steps"][name] = {"exit": rc, "wall_s": int(secs)}
    keys = ("checkpoint_s", "train_s", "steps", "steps_per_s", "psnr", "psnr_ngp", "mem_peak_gb")
    for f in sorted(out.glob("*_*.json")):  # <capture>_<storage>.json
        doc = json.loads(f.read_text())
        summary.setdefault("device", doc.get("device"))
        points = doc.get("points") or [{}]
        summary["runs"][f.stem] = {k: points[0].get(k) for k in keys}
        log = logs / f"{f.stem}.log" if logs is not None else None
        choice = auto_choice(log.read_text(errors="replace")) if log is not None and log.is_file() else None
        if choice is not None:
            summary["auto"][f.stem.rsplit("_", 1)[0]] = choice
    for scene in sorted({name.rsplit("_", 1)[0] for name in summary["runs"]}):
        d, h = summary["runs"].get(f"{scene}_device"), summary["runs"].get(f"{scene}_host")
        if d and h and d.get("steps_per_s") and h.get("steps_per_s"):
            summary[f"{scene}_host_over_device_steps_per_s"] = h["steps_per_s"] / d["steps_per_s"]
        if d and h and d.get("psnr") is not None and h.get("psnr") is not None:
            summary[f"{scene}_host_minus_device_psnr"] = h["psnr"] - d["psnr"]
    return summary


def logged_curve(argv: list[str]) -> int:
    """``bench.curve``'s main with ``data/host_pixels``'s line (logger ``nerf_lightning.data.datamodule``)
    shown: bench.curve composes the config without Hydra's logging set-up."""
    import logging

    from nerf_lightning.bench.curve import main as curve_main

    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    placement = logging.getLogger("nerf_lightning.data.datamodule")
    placement.addHandler(handler)
    placement.setLevel(logging.INFO)
    return curve_main(argv)


def main(argv: list[str] | None = None) -> None:
    args_in = sys.argv[1:] if argv is None else argv
    if args_in[:1] == ["curve"]:  # its arguments are bench.curve's own
        raise SystemExit(logged_curve(args_in[1:]))
    p = argparse.ArgumentParser(prog="python -m benchmarks.big_captures", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("curve", help="bench.curve with the storage choice logged (its arguments follow)")
    m = sub.add_parser("memory")
    m.add_argument("--views", type=int, default=48)
    m.add_argument("--width", type=int, default=320)
    m.add_argument("--height", type=int, default=240)
    m.add_argument("--root", type=Path, default=Path("outputs/scenes"))
    o = sub.add_parser("overhead")
    o.add_argument("--steps", type=int, default=60)
    o.add_argument("--rounds", type=int, default=3)
    o.add_argument("--out", type=Path, default=Path("outputs/bench/big_captures"))
    o.add_argument("--draw-scene", type=Path, default=None, help="also time the draws alone on this capture")
    o.add_argument("--rays", type=int, default=2048, help="rays per draw (the CPU preset's batch)")
    o.add_argument("overrides", nargs="*")
    g = sub.add_parser("generate")
    g.add_argument("--gb", required=True, help="training pixels to reach, GB (1e9 bytes), or auto (auto_gb)")
    g.add_argument("--views", type=int, default=160, help="renders per round (a multiple of 8)")
    g.add_argument("--width", type=int, default=2000)
    g.add_argument("--height", type=int, default=1500)
    g.add_argument("--root", type=Path, default=Path("outputs/scenes"))
    g.add_argument("--json", type=Path, default=None)
    s = sub.add_parser("summarize")
    s.add_argument("out", type=Path)
    s.add_argument("--logs", type=Path, default=None, help="the runs' logs (<run>.log)")
    args = p.parse_args(args_in)
    if args.cmd == "memory":
        path = ensure_large_capture(args.root, args.views, args.width, args.height)
        rows = memory(path, args.root / "cache")
        print(f"capture: {path} ({args.views} views of {args.width}x{args.height}, RGBA)")
        print(memory_table(rows))
    elif args.cmd == "overhead":
        if args.draw_scene is not None:
            for row in draw_overhead(args.draw_scene, args.rays, 50, args.rounds):
                print(f"draws of {args.rays} rays, round {row['round']}: device {row['device_ms']:.2f} ms, "
                      f"host {row['host_ms']:.2f} ms", flush=True)  # fmt: skip
        rows = overhead(args.steps, args.rounds, args.overrides, args.out)
        print(overhead_table(rows))
    elif args.cmd == "summarize":
        summary = summarize(args.out, args.logs)
        atomic_write_json(args.out / "summary.json", summary)
        print(json.dumps(summary, indent=2))
    else:
        if args.views % 8:
            p.error("--views must be a multiple of 8 (no held-out view among the training frames)")
        sizing: dict[str, Any] = {}
        if args.gb == "auto":
            free, ram = machine_memory()
            limit = FRACTION * free / 1e9
            sizing = {"gpu_free_gb": free / 1e9, "host_ram_gb": ram / 1e9, "auto_limit_gb": limit}
            gb = auto_gb(free, ram) if free else 1.0
        else:
            gb = float(args.gb)
        info = {**generate(gb, args.views, args.width, args.height, args.root), **sizing}
        if args.json is not None:
            atomic_write_json(args.json, info)
        print(json.dumps(info))
        print(info["path"])


if __name__ == "__main__":
    main()
