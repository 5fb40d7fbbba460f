"""What the viewer draws around the rendered field: the training cameras, the scene box and the occupancy
grid's occupied cells, each with a toggle; a click on a camera jumps there.

Everything is in NGP space (see ``viewer/browser_camera.py``). The scene's up direction is the training
cameras' mean up, so that the browser's orbit controls turn around the capture's vertical.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import viser

from nerf_lightning.data.scene_space import SceneSpace
from nerf_lightning.data.types import Capture
from nerf_lightning.video.camera_paths import focus_point
from nerf_lightning.viewer.browser_camera import fov_y_of, wxyz_of

__all__ = ["SceneInfo", "SceneWidgets"]

#: most occupied cells drawn (a random subset beyond; the browser draws each as a point)
MAX_CELLS = 200_000
_CASCADE_COLOURS = np.array([[255, 140, 0], [60, 160, 255], [150, 90, 220], [90, 200, 120]], dtype=np.uint8)


@dataclass(frozen=True)
class SceneInfo:
    """The capture as the viewer shows it: training cameras (NGP-space OpenCV camera-to-world [V, 4, 4],
    vertical fields of view [V] in radians, aspect ratios [V], image sizes and names), the outer box
    (``aabb_scale``), the evaluation background and the capture-space map (for camera paths)."""

    poses: np.ndarray
    fov_y: np.ndarray
    aspect: np.ndarray
    sizes: list[tuple[int, int]]
    names: list[str]
    aabb_scale: int
    background: tuple[float, float, float]
    space: SceneSpace

    @classmethod
    def of(cls, capture: Capture) -> SceneInfo:
        frames = capture.train or capture.val
        if not frames:
            raise ValueError(f"{capture.root}: the capture has no views to show")
        poses = np.stack([np.asarray(f.c2w, np.float64)[:4, :4] for f in frames])
        k = [f.intrinsics for f in frames]
        return cls(
            poses=poses,
            fov_y=np.array([fov_y_of(i.height, i.fy) for i in k]),
            aspect=np.array([i.width / i.height for i in k]),
            sizes=[(i.width, i.height) for i in k],
            names=[f.image_path.stem for f in frames],
            aabb_scale=int(capture.aabb_scale),
            background=tuple(float(v) for v in capture.eval_background),  # type: ignore[arg-type]
            space=SceneSpace.of(capture),
        )

    @property
    def up(self) -> np.ndarray:
        """Mean up direction of the training cameras (OpenCV camera y points down)."""
        up = -self.poses[:, :3, 1].mean(axis=0)
        return up / max(float(np.linalg.norm(up)), 1e-9)

    @property
    def focus(self) -> np.ndarray:
        """The point the training cameras look at (closest to their optical axes)."""
        return focus_point(self.poses)

    @property
    def camera_distance(self) -> float:
        """Median distance of the training cameras from the focus point."""
        return float(np.median(np.linalg.norm(self.poses[:, :3, 3] - self.focus, axis=1)))


class SceneWidgets:
    """The scene nodes of one viser server and their toggles (a "Scene" GUI folder)."""

    def __init__(
        self,
        server: viser.ViserServer,
        info: SceneInfo,
        on_camera_click: Callable[[viser.ClientHandle, int], None],
    ) -> None:
        self.server = server
        self.info = info
        server.scene.set_up_direction(tuple(float(v) for v in info.up))
        scale = 0.08 * max(info.camera_distance, 1e-3)
        self.frustums = []
        for i, (c2w, fov, aspect) in enumerate(zip(info.poses, info.fov_y, info.aspect, strict=True)):
            handle = server.scene.add_camera_frustum(
                f"/training_cameras/{i:04d}",
                fov=float(fov),
                aspect=float(aspect),
                scale=scale,
                thickness=0.01 * scale,
                color=(40, 40, 40),
                wxyz=wxyz_of(c2w),
                position=c2w[:3, 3],
            )
            handle.on_click(lambda event, i=i: on_camera_click(event.client, i))
            self.frustums.append(handle)
        s = float(info.aabb_scale)
        self.unit_box = server.scene.add_box(
            "/scene_box/unit_cube", color=(230, 160, 30), dimensions=(1.0, 1.0, 1.0), wireframe=True,
            position=(0.5, 0.5, 0.5),
        )  # fmt: skip
        self.outer_box = server.scene.add_box(
            "/scene_box/aabb", color=(120, 120, 120), dimensions=(s, s, s), wireframe=True,
            position=(0.5, 0.5, 0.5), visible=info.aabb_scale > 1,
        )  # fmt: skip
        self.cells: viser.PointCloudHandle | None = None

        with server.gui.add_folder("Scene"):
            self.show_cameras = server.gui.add_checkbox("Training cameras", True)
            self.show_box = server.gui.add_checkbox("Scene box", True)
            self.show_cells = server.gui.add_checkbox(
                "Occupied cells", False, hint="the occupancy grid's occupied cells (where rays take samples)"
            )
            self.view_index = server.gui.add_slider(
                "Training view", min=0, max=max(len(info.poses) - 1, 0), step=1, initial_value=0,
                hint="jump to a training camera (or click one in the scene)",
            )  # fmt: skip
        self.show_cameras.on_update(lambda _: self._set_visible(self.frustums, self.show_cameras.value))
        self.show_box.on_update(
            lambda _: (
                setattr(self.unit_box, "visible", self.show_box.value),
                setattr(self.outer_box, "visible", self.show_box.value and info.aabb_scale > 1),
            )
        )
        self.view_index.on_update(lambda event: on_camera_click(event.client, int(self.view_index.value)))

    @staticmethod
    def _set_visible(handles: list, visible: bool) -> None:
        for h in handles:
            h.visible = visible

    @property
    def wants_cells(self) -> bool:
        return bool(self.show_cells.value)

    def set_cells(self, centres: np.ndarray, cascades: np.ndarray, cell_size: float) -> None:
        """Show the occupied cells (centres float [N, 3] in NGP space, cascade index [N]); cascade 0's cell
        edge is ``cell_size``."""
        if len(centres) > MAX_CELLS:
            keep = np.random.default_rng(0).choice(len(centres), MAX_CELLS, replace=False)
            centres, cascades = centres[keep], cascades[keep]
        colours = _CASCADE_COLOURS[np.minimum(cascades, len(_CASCADE_COLOURS) - 1)]
        self.cells = self.server.scene.add_point_cloud(
            "/occupancy/cells",
            points=centres.astype(np.float32),
            colors=colours,
            point_size=cell_size,
            point_shape="square",
            visible=True,
        )

    def hide_cells(self) -> None:
        if self.cells is not None:
            self.cells.visible = False
