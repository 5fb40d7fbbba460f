"""Hydra app: a trained checkpoint in the browser.

    python -m nerf_lightning.view ckpt=PATH [port=7007] [host=127.0.0.1] [max_size=1024] [preview_size=256]

Rebuilds the model from the checkpoint alone (``run.restore``, as ``eval`` / ``render`` do) and serves it
with viser (``viewer/server.py``): the field rendered from the browser's camera (RGB, depth,
accumulation; a preview while the camera moves, full resolution when it stops), the training cameras
(click one to jump there), the scene box and the occupancy grid's cells, and a camera-path editor whose
``camera_path.json`` (written into this run's folder, ``outputs/runs/view/<date>_<time>/``) renders with
``python -m nerf_lightning.render``. Prints the URL; listens on ``127.0.0.1`` (this machine only): over
SSH, ``ssh -L 7007:localhost:7007 HOST`` and open ``http://localhost:7007``. On another host
(``host=0.0.0.0``) a browser needs the token in the printed URL (``?token=...``: generated per launch,
or ``token=``; ``viewer/access.py``). Without a GPU it renders on the CPU at a low resolution (and says
so). Runs until Ctrl-C (or ``max_seconds``).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import torch
from omegaconf import DictConfig

from nerf_lightning.apps.config_checks import check_config, read_options
from nerf_lightning.apps.entry import device_of, hydra_app, nested_overrides
from nerf_lightning.config_schema import Note, Range
from nerf_lightning.errors import UserError
from nerf_lightning.run.folder_commit import commit_run_folder
from nerf_lightning.run.restore import load_run
from nerf_lightning.viewer.options import MaxSize, Port, PreviewSize

log = logging.getLogger("nerf_lightning.view")

#: (max_size, preview_size) defaults: longest side of a full frame and of the preview, in pixels
GPU_SIZES = (1024, 256)
CPU_SIZES = (256, 64)


@dataclass(frozen=True)
class ViewOptions:
    """The viewer app's own keys (``conf/view.yaml``, where each is described)."""

    host: str
    port: Port
    max_size: MaxSize
    preview_size: PreviewSize
    chunk: Annotated[int, Range(low=1)]
    max_seconds: Annotated[float | None, Range(above=0), Note("null: until Ctrl-C")]
    token: str | None = None  # checked by viewer/access.check_token (it goes into a URL)


def build_viewer(cfg: DictConfig):  # noqa: ANN201 - ViewerServer (viser imported here, not at module load)
    """The viewer of ``cfg`` (see ``conf/view.yaml``), listening; the caller runs its loop."""
    from nerf_lightning.viewer.access import check_token
    from nerf_lightning.viewer.ports import check_port
    from nerf_lightning.viewer.scene import SceneInfo
    from nerf_lightning.viewer.server import RenderSource, ViewerServer

    opts = check_config(cfg, ViewOptions)  # types and ranges first
    check_port(str(opts.host), opts.port)  # before the checkpoint is read: a taken port fails at once
    token = check_token(opts.token)
    run = load_run(cfg.ckpt)
    device = device_of(str(cfg.accelerator))
    capture = run.load_capture(nested_overrides(cfg.get("data")))
    try:
        info = SceneInfo.of(capture)
    except ValueError as err:
        raise UserError(str(err)) from err
    default_max, default_preview = GPU_SIZES if device.type == "cuda" else CPU_SIZES
    max_size = int(opts.max_size or default_max)
    preview_size = int(opts.preview_size or min(default_preview, max_size))
    if device.type == "cpu":
        why = "no GPU" if not torch.cuda.is_available() else f"accelerator={cfg.accelerator}"
        print(
            f"[nerf_lightning] {why}: the viewer renders on the CPU at a low resolution "
            f"(frames up to {max_size} px, {preview_size} px while the camera moves; max_size=... to change)",
            file=sys.stderr,
            flush=True,
        )
    model = run.build_model(nested_overrides(cfg.get("model"))).to(device)
    commit_run_folder()  # every check has passed
    source = RenderSource(
        renderer=model.renderer,
        field=model.field,
        background=torch.tensor(capture.eval_background, dtype=torch.float32, device=device),
        device=device,
        chunk=opts.chunk,
        context=torch.inference_mode,
    )
    out_dir = Path(cfg.paths.output_dir)
    server = ViewerServer(
        info,
        source,
        host=str(opts.host),
        port=opts.port,
        token=token,
        max_size=max_size,
        preview_size=preview_size,
        export_dir=out_dir,
        render_command=f"python -m nerf_lightning.render ckpt={run.path}",
        chunk_s=0.02 if device.type == "cuda" else 0.25,
    )
    log.info("viewer of %s (step %d) on %s at %s", run.path, run.global_step, device, server.url)
    print(
        f"viewer: {server.url}  ({run.path}, step {run.global_step}; over SSH: ssh -L "
        f"{server.port}:localhost:{server.port} HOST; camera paths go to {out_dir}; Ctrl-C to stop)",
        flush=True,
    )
    return server


def view(cfg: DictConfig) -> None:
    """Serve the checkpoint of ``cfg`` until Ctrl-C or ``cfg.max_seconds``."""
    server = build_viewer(cfg)
    max_seconds = read_options(cfg, ViewOptions).max_seconds
    try:
        server.serve_forever(None if max_seconds is None else float(max_seconds))
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


# SIGTERM (a service manager, `timeout`): exit 143 after the server is closed (`finally` above)
main = hydra_app("view", view, stop_on_sigterm=True)

if __name__ == "__main__":
    main()
