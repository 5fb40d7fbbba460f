"""Export a checkpoint as glb and as ply at equal triangles; time, size, held-out PSNR; a screenshot.

    python -m benchmarks.mesh_export RUN --scene CAPTURE [--views N] [--shot PNG] [ARGS...]

ARGS are ``export mesh`` overrides (``resolution=256 texture_size=2048``). The PSNR is
:func:`benchmarks.mesh_render.held_out_psnr` (the mesh ray-cast from the held-out cameras against the
field's renders). The screenshot is the glb ray-cast from the first held-out camera, 512 pixels wide.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np


def _screenshot(mesh, scene: Path, run_dir: Path, path: Path, width: int = 512) -> None:  # noqa: ANN001
    import imageio.v3 as iio

    from benchmarks.mesh_render import shade
    from nerf_lightning.run.restore import load_run

    doc = json.loads((scene / "transforms.json").read_text())
    name = load_run(run_dir).load_capture().val[0].image_path.name
    c2w = next(np.asarray(f["transform_matrix"]) for f in doc["frames"] if Path(f["file_path"]).name == name)
    k = width / doc["w"]
    w, h = int(doc["w"] * k), int(doc["h"] * k)
    iy, ix = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
    d = np.stack([(ix - doc["cx"] * k) / (doc["fl_x"] * k), -(iy - doc["cy"] * k) / (doc["fl_y"] * k),
                  -np.ones_like(ix)], -1).reshape(-1, 3) @ c2w[:3, :3].T  # fmt: skip
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    o = np.broadcast_to(c2w[:3, 3], d.shape).copy()
    o, d = o[:, [0, 2, 1]] * [1, 1, -1], d[:, [0, 2, 1]] * [1, 1, -1]  # the glb is +Y up
    rgb, _ = shade(mesh, o, d)
    path.parent.mkdir(parents=True, exist_ok=True)
    iio.imwrite(path, (rgb.reshape(h, w, 3) * 255).round().astype(np.uint8))


def main() -> None:
    import trimesh
    from hydra.core.global_hydra import GlobalHydra

    from benchmarks.mesh_render import held_out_psnr
    from nerf_lightning.apps.export import export
    from nerf_lightning.run.config import compose_app_config

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--scene", type=Path, required=True, help="the capture folder (transforms.json)")
    parser.add_argument("--shot", type=Path, default=None)
    parser.add_argument("--views", type=int, default=None, help="score the first N held-out views only")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_intermixed_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("glb", "ply"):
            cfg = compose_app_config("export", ["what=mesh", f"ckpt={args.run}", f"format={fmt}",
                                                *args.overrides], Path(tmp) / fmt)  # fmt: skip
            GlobalHydra.instance().clear()
            info = export(cfg)
            mesh = trimesh.load(info["mesh"], force="mesh", process=False)
            psnr = held_out_psnr(args.run, args.scene, mesh, info["up"], args.views)
            size = sum(Path(p).stat().st_size for p in info["files"])
            rows[fmt] = {"seconds": round(info["seconds"], 1), "triangles": info["faces"],
                         "bytes": size, "psnr": round(psnr, 2)}  # fmt: skip
            if fmt == "glb" and args.shot is not None:
                _screenshot(mesh, args.scene, args.run, args.shot)
    print(json.dumps(rows, indent=2), flush=True)


if __name__ == "__main__":
    main()
