"""Every malformed capture gives a CaptureError naming the file, the frame/key and what was expected."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nerf_lightning.data.formats import CaptureError, load_capture


def _edit(root: Path, fn) -> Path:
    p = root / "transforms.json"
    data = json.loads(p.read_text())
    fn(data)
    p.write_text(json.dumps(data))
    return p


def test_error_is_a_value_error():
    assert issubclass(CaptureError, ValueError)


def test_path_does_not_exist(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(CaptureError, match=re.escape(str(missing)) + ".*does not exist"):
        load_capture(missing)


def test_no_transforms_file(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CaptureError, match=r"empty: no transforms file.*transforms\.json"):
        load_capture(tmp_path / "empty")


@pytest.mark.parametrize("inside", [".", "images"])
def test_a_folder_of_photos_without_poses_says_how_to_make_a_capture(tmp_path, inside):
    photos = tmp_path / "photos"
    (photos / inside).mkdir(parents=True)
    for name in ("IMG_0001.JPG", "IMG_0002.JPG", "IMG_0003.jpeg"):
        (photos / inside / name).write_bytes(b"")
    folder = (photos / inside).resolve()
    with pytest.raises(CaptureError) as err:
        load_capture(photos)
    assert str(err.value) == (
        f"{photos}: no transforms file; expected transforms.json (instant-ngp / nerfstudio) or "
        f"transforms_train.json (Blender); its 3 photos have no camera poses: python -m "
        f"nerf_lightning.process images={folder} out=CAPTURE makes a capture of them, then data.path=CAPTURE"
    )


def test_malformed_json_reports_line_and_column(make_ngp):
    root = make_ngp(n=2)
    p = root / "transforms.json"
    p.write_text('{\n  "fl_x": 20,\n  "frames": [,]\n}\n')
    with pytest.raises(CaptureError, match=r"transforms\.json: malformed JSON at line 3, column 14"):
        load_capture(root)


def test_frames_key_missing(make_ngp):
    root = make_ngp(n=2)
    _edit(root, lambda d: d.pop("frames"))
    with pytest.raises(CaptureError, match=r"transforms\.json: expected key 'frames'"):
        load_capture(root)


def test_frame_without_transform_matrix(make_ngp):
    root = make_ngp(n=3)
    _edit(root, lambda d: d["frames"][1].pop("transform_matrix"))
    with pytest.raises(
        CaptureError, match=r"transforms\.json: frame 1 \(images/0001\.png\): missing key 'transform_matrix'"
    ):
        load_capture(root)


def test_matrix_not_4x4(make_ngp):
    root = make_ngp(n=3)
    _edit(root, lambda d: d["frames"][2].update(transform_matrix=d["frames"][2]["transform_matrix"][:3]))
    with pytest.raises(
        CaptureError,
        match=r"frame 2 \(images/0002\.png\): 'transform_matrix' has shape \[3, 4\], expected \[4, 4\]",
    ):
        load_capture(root)


def test_matrix_with_nan(make_ngp):
    root = make_ngp(n=3)
    p = root / "transforms.json"
    data = json.loads(p.read_text())
    data["frames"][0]["transform_matrix"][0][3] = float("nan")
    p.write_text(json.dumps(data))  # json writes the NaN literal, which Python's parser accepts
    with pytest.raises(
        CaptureError, match=r"frame 0 \(images/0000\.png\): 'transform_matrix' contains NaN or inf"
    ):
        load_capture(root)


def test_no_intrinsics_at_all(make_ngp):
    root = make_ngp(n=2)
    _edit(root, lambda d: [d.pop(k) for k in ("fl_x", "fl_y")])
    with pytest.raises(
        CaptureError, match=r"transforms\.json: no intrinsics at all; expected 'fl_x'.*'camera_angle_x'"
    ):
        load_capture(root)


def test_images_of_different_sizes_without_per_frame_intrinsics(make_ngp):
    root = make_ngp(n=3, image_sizes={1: (20, 12)})
    with pytest.raises(
        CaptureError,
        match=r"frame 1 \(images/0001\.png\): image is 20x12 but the global intrinsics are for 16x12",
    ):
        load_capture(root)


def test_rotated_image_is_named_as_such(make_ngp):
    # a portrait phone image re-saved upright by an EXIF-aware tool after COLMAP saw it in landscape
    root = make_ngp(n=2, image_sizes={0: (12, 16)})
    with pytest.raises(
        CaptureError, match=r"image is 12x16 but .* for 16x12; width and height are swapped.*EXIF"
    ):
        load_capture(root)


def test_zero_usable_frames(make_ngp):
    root = make_ngp(n=3, missing=(0, 1, 2))
    with pytest.warns(UserWarning, match="skipped 3 of 3"):
        with pytest.raises(
            CaptureError, match=r"transforms\.json: zero usable frames \(3 listed, 3 with missing"
        ):
            load_capture(root)


def test_all_frames_below_min_sharpness(make_ngp):
    root = make_ngp(n=2, sharpness=[1.0, 2.0])
    with pytest.raises(CaptureError, match=r"zero usable frames .*2 below min_sharpness"):
        load_capture(root, min_sharpness=5.0)


def test_non_numeric_intrinsic(make_ngp):
    root = make_ngp(n=2)
    _edit(root, lambda d: d.update(cx="middle"))
    with pytest.raises(
        CaptureError, match=r"frame 0 \(images/0000\.png\): key 'cx' must be a number, got 'middle'"
    ):
        load_capture(root)


def test_image_that_is_not_an_image(make_ngp):
    root = make_ngp(n=2)
    (root / "images/0001.png").write_text("not a png")
    with pytest.raises(CaptureError, match=r"0001\.png: cannot read image header"):
        load_capture(root)


def test_unsupported_nerfstudio_camera_model(make_nerfstudio):
    root = make_nerfstudio(n=2, camera_model="EQUIRECTANGULAR")
    with pytest.raises(
        CaptureError, match=r"transforms\.json: 'camera_model' is 'EQUIRECTANGULAR'; supported: PINHOLE"
    ):
        load_capture(root)


def test_blender_split_file_malformed(blender_capture):
    (blender_capture / "transforms_val.json").write_text("[1, 2")
    with pytest.raises(CaptureError, match=r"transforms_val\.json: malformed JSON at line 1, column 6"):
        load_capture(blender_capture)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"downscale": 0}, "downscale must be an integer >= 1, got 0"),
        ({"downscale": 1.5}, "downscale must be an integer >= 1, got 1.5"),
        ({"test_every": 1}, "test_every must be 0 .* or >= 2, got 1"),
        ({"format": "colmap"}, "unknown format 'colmap'"),
    ],
)
def test_bad_arguments(make_ngp, kwargs, message):
    root = make_ngp(n=2)
    with pytest.raises(CaptureError, match=message):
        load_capture(root, **kwargs)


def test_non_numeric_aabb_scale(make_ngp):
    root = make_ngp(n=2, header={"aabb_scale": "big"})
    with pytest.raises(CaptureError, match=r"transforms\.json: top level: key 'aabb_scale' must be a number"):
        load_capture(root)


@pytest.mark.parametrize("value", [0, 1000, 3, 2.5, -4])
def test_aabb_scale_out_of_range_names_the_file_and_key(make_ngp, value):
    root = make_ngp(n=2, header={"aabb_scale": value})
    with pytest.raises(CaptureError) as err:
        load_capture(root)
    where = f"{root / 'transforms.json'}: key 'aabb_scale'"
    assert str(err.value).startswith(f"{where} is {value:g}: expected a power of two")
    assert "from 1 to 128" in str(err.value)
    assert load_capture(make_ngp(n=2, header={"aabb_scale": 16}, name="ok")).aabb_scale == 16


def test_aabb_scale_override_names_the_config_key(make_ngp):
    with pytest.raises(CaptureError, match=r"^data\.aabb_scale is 1000: expected a power of two"):
        load_capture(make_ngp(n=2), aabb_scale=1000)


@pytest.mark.parametrize(
    ("header", "keys"),
    [
        ({"fl_x": -20.0, "fl_y": -21.0}, "'fl_x'/'fl_y'"),
        ({"fl_x": 0.0, "fl_y": 21.0}, "'fl_x'/'fl_y'"),
        ({"fl_x": None, "fl_y": None, "camera_angle_x": -0.7}, "'camera_angle_x'/'camera_angle_y'"),
    ],
)
def test_non_positive_focal_length_is_refused(make_ngp, header, keys):
    root = make_ngp(n=2, header=header)
    data = json.loads((root / "transforms.json").read_text())
    for k in [k for k, v in header.items() if v is None]:
        data.pop(k)
    (root / "transforms.json").write_text(json.dumps(data))
    with pytest.raises(CaptureError) as err:
        load_capture(root)
    line = str(err.value)
    assert line.startswith(f"{root / 'transforms.json'}: frame 0 (") and "focal length" in line
    assert keys in line and line.endswith("expected > 0")
