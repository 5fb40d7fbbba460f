"""Every malformed capture gives a CaptureError naming the file, the frame/key and what was expected."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
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


# ------------------------------------------------------------------- issue 66: values that made no view
def test_a_frame_whose_rotation_is_zero_is_refused_as_the_camera_path_reader_refuses_it(make_ngp, tmp_path):
    """A zero rotation makes a camera that sees nothing: the capture reader refuses it, naming the file
    and the frame, for the reason (one shared check) the camera-path reader gives for the same matrix."""
    from nerf_lightning.errors import UserError
    from nerf_lightning.video.camera_paths import read_nerfstudio_path

    zero = [[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, 3.0], [0.0, 0.0, 0.0, 1.0]]
    root = make_ngp(n=3)
    _edit(root, lambda d: d["frames"][1].update(transform_matrix=zero))
    with pytest.raises(CaptureError) as err:
        load_capture(root)
    reason = "its rotation is not invertible: determinant 0; expected a rotation matrix"
    assert str(err.value) == (
        f"{root / 'transforms.json'}: frame 1 (images/0001.png): 'transform_matrix' is not a camera pose "
        f"({reason})"
    )
    path = tmp_path / "camera_path.json"
    keyframe = {"camera_to_world": sum(zero, []), "fov": 50}
    path.write_text(json.dumps({"render_width": 4, "render_height": 3, "camera_path": [keyframe]}))
    with pytest.raises(UserError) as from_path:
        read_nerfstudio_path(path, None)
    from_camera_path = f"{path}: camera_path[0]: `camera_to_world` is not a camera pose ({reason})"
    assert str(from_path.value) == from_camera_path


def test_a_zero_field_of_view_names_the_key_and_its_range(make_ngp):
    root = make_ngp(n=2)
    _edit(root, lambda d: [d.pop(k) for k in ("fl_x", "fl_y")] and d.update(camera_angle_x=0))
    with pytest.raises(CaptureError) as err:
        load_capture(root)  # was a ZeroDivisionError
    assert str(err.value) == (
        f"{root / 'transforms.json'}: frame 0 (images/0000.png): key 'camera_angle_x' is 0; expected the "
        "field of view in radians, > 0 and < pi"
    )


def test_a_null_file_path_is_named_as_such(make_ngp):
    root = make_ngp(n=3)
    _edit(root, lambda d: d["frames"][2].update(file_path=None))
    with pytest.raises(CaptureError) as err:
        load_capture(root)  # was a warning about a missing image "None"
    assert str(err.value) == (
        f"{root / 'transforms.json'}: frame 2: 'file_path' is null; expected the image's path (a string)"
    )


def test_a_camera_a_million_units_away_or_a_focal_length_of_a_million_pixels_is_refused(make_ngp):
    root = make_ngp(n=3)
    _edit(root, lambda d: d["frames"][1]["transform_matrix"][0].__setitem__(3, 1e30))
    with pytest.raises(CaptureError) as err:
        load_capture(root)
    assert str(err.value) == (
        f"{root / 'transforms.json'}: frame images/0001.png: its camera centre is 3.3e+29 scene units from "
        "the scene's centre ('transform_matrix' times scale 0.33); expected at most 1e+06"
    )
    root = make_ngp(n=3, name="focal", header={"fl_x": 1e30})
    with pytest.raises(CaptureError) as err:
        load_capture(root)
    assert str(err.value) == (
        f"{root / 'transforms.json'}: frame 0 (images/0000.png): focal length 1e+30, 21 pixels from "
        "'fl_x'/'fl_y'; expected at most 1e+06 pixels"
    )
    # far but usable: a camera 1e5 units away and a 1e5-pixel telephoto still load
    root = make_ngp(n=3, name="far", header={"fl_x": 1e5, "fl_y": 1e5})
    _edit(root, lambda d: d["frames"][1]["transform_matrix"][0].__setitem__(3, 1e5))
    cap = load_capture(root, test_every=0)
    assert cap.train[0].intrinsics.fx == 1e5 and len(cap.train) == 3


def test_a_nerfstudio_capture_far_from_its_origin_is_normalized_not_refused(make_nerfstudio):
    """Georeferenced poses (UTM: millions of metres) are a consistent world frame: nerfstudio's
    normalization brings them into the unit cube, so the distance limit does not refuse them."""
    cap = load_capture(make_nerfstudio(n=9, shift=(4.5e6, 5.2e6, 300.0)), test_every=0)
    centres = np.stack([f.c2w[:3, 3] for f in cap.train])
    assert len(cap.train) == 9 and np.abs(centres - 0.5).max() <= 0.5 + 1e-6


def test_a_nerfstudio_camera_far_out_of_its_cameras_spread_is_refused(make_nerfstudio):
    """One translation of 1e30 among cameras 3 units from their centre: normalizing by the spread would
    shrink the other eight cameras to a point, so the capture is refused naming the frame."""
    root = make_nerfstudio(n=9, shift=(4.5e6, 5.2e6, 300.0))
    doc = json.loads((root / "transforms.json").read_text())
    doc["frames"][4]["transform_matrix"][1][3] = 1e30
    (root / "transforms.json").write_text(json.dumps(doc))
    with pytest.raises(CaptureError) as err:
        load_capture(root, test_every=0)
    # the other cameras lie about 3 units (the orbit's radius) from their median centre: ~3e29 x
    message = str(err.value)
    head = f"{root / 'transforms.json'}: frame images/frame_00004.png: its camera centre is 1e+30 from"
    assert message.startswith(head)
    ratio, typical = re.search(r", ([0-9.e+]+)x their median distance ([0-9.]+);", message).groups()
    assert 2.5e29 < float(ratio) < 4e29 and 2.5 < float(typical) < 4
    assert message.endswith("expected at most 1e+06x (a broken 'transform_matrix')")


def _png_header(width: int, height: int) -> bytes:
    """A PNG of ``width`` x ``height`` 1-bit grey pixels whose image data is missing: enough for a header."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def test_an_image_over_pillows_pixel_limit_names_the_file_and_the_limit(make_ngp):
    from PIL import Image

    root = make_ngp(n=2)
    big = root / "images/0001.png"
    big.write_bytes(_png_header(30000, 30000))
    limit = 2 * Image.MAX_IMAGE_PIXELS
    with pytest.raises(CaptureError) as err:
        load_capture(root)  # was Pillow's DecompressionBombError, naming no file
    assert str(err.value) == (
        f"{big}: 900,000,000 pixels, over Pillow's limit of {limit:,} pixels per image (its guard against "
        "decompression bombs, which this program does not raise); expected a smaller image: downsize the "
        "capture's images"
    )


def test_a_data_path_that_is_a_loop_of_links_says_so(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(CaptureError) as err:
        load_capture(tmp_path / "a")  # was "capture path does not exist"
    assert str(err.value) == (
        f"{tmp_path / 'a'}: a symbolic link that leads to no file (a loop of links, or a missing target: "
        f"{tmp_path / 'b'}); expected a directory with transforms.json"
    )
