"""``export mesh format=glb|obj|ply`` on the shared short training of the embedded scene: the files, the
capture's frame, the texture's fidelity against the field's own renders, a real Blender, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trimesh")

import trimesh
from hydra.core.global_hydra import GlobalHydra

from benchmarks.mesh_render import held_out_psnr
from nerf_lightning.apps.export import export
from nerf_lightning.errors import UserError
from nerf_lightning.run.config import compose_app_config

pytestmark = pytest.mark.slow

#: small enough for seconds on 2 cores
SMALL = ("resolution=96", "texture_size=256", "faces=1000")


@pytest.fixture
def app_cfg(tmp_path: Path):
    def _compose(*overrides: str, out: str = "out"):
        return compose_app_config("export", ["what=mesh", *overrides], tmp_path / out)

    yield _compose
    GlobalHydra.instance().clear()


@pytest.fixture(scope="module")
def glb(trained_run, tmp_path_factory) -> tuple[dict, trimesh.Trimesh]:
    run_dir, _ = trained_run
    cfg = compose_app_config(
        "export", ["what=mesh", f"ckpt={run_dir}", *SMALL], tmp_path_factory.mktemp("glb")
    )
    GlobalHydra.instance().clear()
    info = export(cfg)
    return info, trimesh.load(info["mesh"], force="mesh", process=False)


def test_glb_loads_with_uvs_one_material_and_the_requested_texture(glb) -> None:
    info, _ = glb
    scene = trimesh.load(info["mesh"], process=False)
    (mesh,) = scene.geometry.values()  # one mesh
    assert mesh.visual.uv is not None and mesh.visual.uv.shape == (len(mesh.vertices), 2)
    material = mesh.visual.material
    assert isinstance(material, trimesh.visual.material.PBRMaterial)
    assert material.baseColorTexture.size == (256, 256)
    assert 500 <= len(mesh.faces) <= 1000 and info["faces"] == len(mesh.faces)
    texture = np.asarray(material.baseColorTexture.convert("RGB"))
    assert texture.std() > 5 and (texture.sum(axis=-1) > 0).all()  # an image, padded: no black texel
    # the stages account for the whole export, in order
    assert list(info["stage_seconds"]) == ["extract", "clean", "unwrap", "bake", "write"]
    assert sum(info["stage_seconds"].values()) == pytest.approx(info["seconds"], abs=0.05)


def test_glb_bounds_are_the_captures_objects_with_y_up(glb, tiny_scene: Path) -> None:
    """The generator's world box of the objects ([-1.2, -1.2, 0]..[1.2, 1.2, 0.8], +Z up) in glTF's
    +Y-up frame is x in [-1.2, 1.2], y (capture z) in [0, 0.8], z (capture -y) in [-1.2, 1.2]."""
    _, mesh = glb
    box = json.loads((tiny_scene / "transforms.json").read_text())["generator"]["world_bounds"]
    assert box == [-1.2, -1.2, 0.0, 1.2, 1.2, 0.8]
    lo, hi = mesh.bounds
    np.testing.assert_allclose(lo[[0, 2]], [-1.2, -1.2], atol=0.05)
    np.testing.assert_allclose(hi, [1.2, 0.8, 1.2], atol=0.05)
    # below the objects (y < 0) no camera looks: the short training leaves some density there, but the
    # objects' top and sides are where the box says
    assert lo[1] > -1.0


def test_texture_matches_the_fields_renders_better_than_vertex_colours(glb, trained_run, app_cfg) -> None:
    run_dir, _ = trained_run
    info, mesh = glb
    textured = held_out_psnr(run_dir, mesh, "y")
    ply = export(app_cfg(f"ckpt={run_dir}", *SMALL, "format=ply", out="ply"))
    assert ply["up"] == "z" and ply["faces"] == info["faces"]  # equal triangles, capture frame
    plain = held_out_psnr(run_dir, trimesh.load(ply["mesh"], process=False), "z")
    print(f"held-out PSNR over object pixels: texture {textured:.2f} dB, vertex colours {plain:.2f} dB")
    # the bar: at least 25 dB, and vertex colours below the texture
    assert textured >= 25.0
    assert plain < textured - 0.3


def test_obj_writes_obj_mtl_and_png(trained_run, app_cfg) -> None:
    run_dir, _ = trained_run
    info = export(
        app_cfg(f"ckpt={run_dir}", *SMALL, "format=obj", "texture_size=128", "bake_views=0", out="obj")
    )
    folder = Path(info["mesh"]).parent
    names = sorted(p.name for p in folder.iterdir() if p.suffix in (".obj", ".mtl", ".png"))
    assert names[0] == "material_0.png" or names[0].endswith(".png")
    assert {"mesh.obj", "mesh.mtl"} <= set(names) and len(names) == 3
    mesh = trimesh.load(folder / "mesh.obj", force="mesh")
    assert len(mesh.faces) == info["faces"] and mesh.visual.material.image.size == (128, 128)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("resolution=0", "resolution=0: expected an integer >= 1"),
        ("faces=0", "faces=0: expected an integer >= 1"),
        ("texture_size=1000", "texture_size=1000: expected a power of two <= 8192"),
        ("texture_size=16384", "texture_size=16384: expected a power of two <= 8192"),
        (
            "threshold=1e9",
            r"no surface at threshold=1000000000.0 \(density inside the occupied cells ranges 0\.\.\d",
        ),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(trained_run, app_cfg, override: str, message: str) -> None:
    run_dir, _ = trained_run
    cfg = app_cfg(f"ckpt={run_dir}", *SMALL, override, out="bad")
    with pytest.raises(UserError, match=message) as err:
        export(cfg)
    assert "\n" not in str(err.value)
    out = Path(cfg.paths.output_dir)
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]


def test_an_unwritable_output_folder_is_refused_before_any_work(trained_run, app_cfg, tmp_path) -> None:
    run_dir, _ = trained_run
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(UserError, match=f"out={blocker}/meshes: cannot write there"):
        export(app_cfg(f"ckpt={run_dir}", *SMALL, f"out={blocker}/meshes", out="unwritable"))


def test_blender_imports_the_glb(glb, tmp_path: Path) -> None:
    if shutil.which("blender") is None:
        pytest.skip("blender is not installed (Debian: apt-get install blender)")
    info, mesh = glb
    script = tmp_path / "check.py"
    # Debian's Blender 3.4 glTF importer uses `np.bool`, which Debian's NumPy 1.24 no longer has
    script.write_text(
        "import numpy\nnumpy.bool = getattr(numpy, 'bool', bool)\n"
        "import bpy, json, sys\n"
        "bpy.ops.wm.read_factory_settings(use_empty=True)\n"
        f"bpy.ops.import_scene.gltf(filepath={info['mesh']!r})\n"
        "meshes = [o for o in bpy.data.objects if o.type == 'MESH']\n"
        "mats = [m for m in bpy.data.materials if m.users]\n"
        "imgs = [list(i.size) for i in bpy.data.images]\n"
        "faces = sum(len(o.data.polygons) for o in meshes)\n"
        "print('RESULT ' + json.dumps({'meshes': len(meshes), 'materials': len(mats), 'images': imgs,"
        " 'faces': faces, 'uv': [len(o.data.uv_layers) for o in meshes]}))\n"
    )
    proc = subprocess.run(["blender", "-b", "--factory-startup", "--python", str(script)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(line[len("RESULT ") :])
    assert result == {
        "meshes": 1,
        "materials": 1,
        "images": [[256, 256]],
        "faces": len(mesh.faces),
        "uv": [1],
    }


def test_the_mesh_export_bench_writes_both_formats_their_scores_and_a_screenshot(trained_run, tmp_path):
    """``python -m benchmarks.mesh_export`` (BENCHMARKS.md's export rows) on the shared run, at the smallest
    settings: one row per format with its triangles and held-out PSNR, the JSON and the shot."""
    import imageio.v3 as iio

    from benchmarks import mesh_export

    run_dir, _ = trained_run
    shot, table = tmp_path / "shot.png", tmp_path / "rows.json"
    small = ["resolution=48", "texture_size=64", "faces=300", "bake_views=1"]
    rows = mesh_export.main([str(run_dir), "--views", "1", "--width", "20", "--shot", str(shot),
                             "--shot-width", "48", "--json", str(table), *small])  # fmt: skip
    assert json.loads(table.read_text()) == rows
    for fmt in ("glb", "ply"):
        assert 0 < rows[fmt]["triangles"] <= 300 and rows[fmt]["bytes"] > 0
        assert 8 < rows[fmt]["psnr"] < 60, rows[fmt]
    assert rows["glb"]["texture_size"] == 64
    assert iio.imread(shot).shape[1] == 48
