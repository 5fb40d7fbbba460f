"""Procedural synthetic scenes: analytic ray tracing of a textured 3D scene into an instant-ngp capture.

``python -m nerf_lightning.data.synthetic OUT_DIR [--views 64] [--width 256 --height 256] [--seed 0]
[--distortion] [--supersample 2] [--hard-views N]`` writes ``OUT_DIR/transforms.json`` and
``OUT_DIR/images/*.png``. :func:`ensure_default_scene` is the cached embedded scene of ``make train``;
:func:`ensure_large_capture` many views of it at a chosen resolution, cached likewise
(tests and benchmarks of big captures).
"""

from nerf_lightning.data.synthetic.cached import ensure_default_scene, ensure_large_capture
from nerf_lightning.data.synthetic.camera import camera_rays, distort, look_at, pixel_grid, project, undistort
from nerf_lightning.data.synthetic.generate import (
    DEFAULT_SCENE,
    DISTORTION,
    FRUIT_FAILURE,
    GENERATOR_NAME,
    GENERATOR_VERSION,
    closeup_poses,
    generate_scene,
    main,
    orbit_poses,
    render_view,
)
from nerf_lightning.data.synthetic.scene import FruitBedScene, Hit, SyntheticScene

__all__ = [
    "DEFAULT_SCENE",
    "DISTORTION",
    "FRUIT_FAILURE",
    "FruitBedScene",
    "GENERATOR_NAME",
    "GENERATOR_VERSION",
    "Hit",
    "SyntheticScene",
    "camera_rays",
    "closeup_poses",
    "distort",
    "ensure_default_scene",
    "ensure_large_capture",
    "generate_scene",
    "look_at",
    "main",
    "orbit_poses",
    "pixel_grid",
    "project",
    "render_view",
    "undistort",
]
