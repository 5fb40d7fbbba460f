"""The viewer in a real headless browser: Debian's Chromium (software WebGL) driven by selenium.

A ``view`` process serves the shared short training; the page must show the scene (its canvas against a
frame rendered directly from the same camera), follow a camera drag, toggle the scene widgets and export
a camera path from its buttons that ``render`` renders. Skips with one line without Chromium and
chromedriver (``.ci/run`` installs them). ``VIEWER_SCREENSHOT=PATH`` writes the page's screenshot
(a 64-pixel frame of the tiny run) to PATH; the README's picture is ``scripts/viewer_screenshot.py``'s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
from hydra.core.global_hydra import GlobalHydra
from runs import fork_app

from nerf_lightning.apps.render import render_video
from nerf_lightning.run.config import compose_app_config
from nerf_lightning.viewer.ports import next_free_port

from .conftest import stop, wait_for_line

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
try:
    import selenium  # noqa: F401
except ImportError:  # pragma: no cover - dev extra missing
    CHROMEDRIVER = None
if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip(
        "no chromium + chromedriver (apt-get install chromium chromium-driver): browser test skipped",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402

VIEWPORT = (800, 600)
MAX_SIZE, PREVIEW_SIZE = 64, 16
TIMEOUT_S = 150  # per wait; a quiet 2-core machine needs a few seconds for each


@pytest.fixture(scope="module")
def page(trained_run, tmp_path_factory):
    """A `view` process and a headless Chromium showing it."""
    run_dir, _ = trained_run
    out = tmp_path_factory.mktemp("browser")
    port = next_free_port("127.0.0.1", 7900 + os.getpid() % 1000)
    log = out / "view.log"
    proc = fork_app(
        "view", f"ckpt={run_dir}", f"port={port}", f"max_size={MAX_SIZE}", f"preview_size={PREVIEW_SIZE}",
        f"hydra.run.dir={out}", cwd=out, log=log,
    )  # fmt: skip
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--use-angle=swiftshader", "--enable-unsafe-swiftshader", f"--user-data-dir={out / 'chromium'}",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = None
    try:
        url = wait_for_line(log, r"^viewer: (http://\S+)", proc, TIMEOUT_S).group(1)
        driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
        driver.set_page_load_timeout(60)
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False},
        )
        driver.get(url)
        yield {"driver": driver, "dir": out, "log": log, "proc": proc}
    finally:
        if driver is not None:
            driver.quit()
        code = stop(proc)
    assert code == 0, log.read_text()[-2000:]


def _wait_text(driver, pattern: str, timeout_s: float = TIMEOUT_S) -> re.Match[str]:  # noqa: ANN001
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if m := re.search(pattern, driver.find_element(By.TAG_NAME, "body").text):
            return m
        time.sleep(0.3)
    pytest.fail(
        f"the page never showed {pattern!r}; it shows:\n{driver.find_element(By.TAG_NAME, 'body').text}"
    )


def _settled_frame(driver, after: int = 0) -> re.Match[str]:  # noqa: ANN001
    """The status line of a complete frame (number > ``after``) that stays the page's last for a second
    (the page may send its camera more than once while it lays itself out)."""
    end = time.monotonic() + TIMEOUT_S
    last, since = None, time.monotonic()
    while time.monotonic() < end:
        m = re.search(r"frame (\d+) · (\d+)x(\d+)", driver.find_element(By.TAG_NAME, "body").text)
        key = m.group(0) if m else None
        if key != last:
            last, since = key, time.monotonic()
        elif m and int(m.group(1)) > after and time.monotonic() - since > 1.0:
            return m
        time.sleep(0.2)
    pytest.fail(f"no settled frame after frame {after}; the page shows {last!r}")


def _screenshot(driver) -> np.ndarray:  # noqa: ANN001
    time.sleep(0.5)  # a few animation frames after the last change
    return iio.imread(driver.get_screenshot_as_png())[..., :3].astype(np.float64) / 255


def _click(driver, text: str) -> None:  # noqa: ANN001
    """Click the button, checkbox label or folder title that reads ``text``."""
    found = driver.find_elements(
        By.XPATH, f"//button[normalize-space(.)='{text}'] | //label[normalize-space(.)='{text}']"
    )
    found = found or driver.find_elements(By.XPATH, f"//*[normalize-space(text())='{text}']")
    assert found, f"nothing on the page reads {text!r}"
    driver.execute_script("arguments[0].click();", found[0])


def _type(driver, label: str, value: str) -> None:  # noqa: ANN001
    """Type into the GUI input labelled ``label`` (a number or text field), as a user does."""
    field = driver.find_element(By.XPATH, f"//*[normalize-space(text())='{label}']/following::input[1]")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(value, Keys.ENTER)


def _drag(driver, dx: int) -> None:  # noqa: ANN001
    canvas = driver.find_elements(By.TAG_NAME, "canvas")[0]
    actions = ActionChains(driver)
    actions.move_to_element_with_offset(canvas, -VIEWPORT[0] // 4, 0).click_and_hold()
    for _ in range(8):
        actions.move_by_offset(dx // 8, 0)
    actions.release().perform()


#: the part of the page not covered by the GUI panel (right), the notice (top left) or the axes (bottom left)
REGION = (slice(150, 560), slice(60, 440))


def test_the_page_shows_the_scene_follows_the_camera_and_exports_a_path(page, scene, trained_run) -> None:
    driver = page["driver"]
    first_frame = _settled_frame(driver)
    n_frame, width, height = (int(first_frame.group(i)) for i in (1, 2, 3))
    for close in driver.find_elements(By.CSS_SELECTOR, "button[class*='mantine-Notification-close']"):
        close.click()  # the software-WebGL notice
    end = time.monotonic() + 10
    while (
        driver.find_elements(By.CSS_SELECTOR, "[class*='mantine-Notification-root']")
        and time.monotonic() < end
    ):
        time.sleep(0.2)
    shot = _screenshot(driver)
    iio.imwrite(page["dir"] / "viewer.png", (shot * 255).round().astype(np.uint8))
    if os.environ.get("VIEWER_SCREENSHOT"):
        shutil.copy(page["dir"] / "viewer.png", os.environ["VIEWER_SCREENSHOT"])

    # the canvas shows the model's render from the browser's camera (training view 0, where the page
    # opens), stretched over the canvas: rendered directly here and compared where no widget is drawn
    _click(driver, "Training cameras")
    _click(driver, "Scene box")
    shot = _screenshot(driver)
    canvas_w, canvas_h = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    cam = scene.view(0, (canvas_w, canvas_h))
    expected = scene.render(cam, MAX_SIZE)["rgb"]
    assert expected.shape[:2] == (height, width)
    from PIL import Image

    expected_up = np.asarray(Image.fromarray(expected).resize((canvas_w, canvas_h), Image.BILINEAR)) / 255
    diff = np.abs(shot[REGION] - expected_up[REGION]).mean(axis=-1)
    assert shot[REGION].std() > 0.05, "a blank canvas"
    assert np.median(diff) < 0.03 and np.percentile(diff, 90) < 0.1, (
        np.median(diff),
        np.percentile(diff, 90),
    )
    other = scene.render(scene.view(5, (canvas_w, canvas_h)), MAX_SIZE)["rgb"]
    other_up = np.asarray(Image.fromarray(other).resize((canvas_w, canvas_h), Image.BILINEAR)) / 255
    assert (
        np.percentile(np.abs(shot[REGION] - other_up[REGION]).mean(axis=-1), 90) > 0.1
    )  # the check can fail

    # a drag on the canvas orbits the camera: a new frame, a different picture
    _click(driver, "Camera path")  # open the folder
    _click(driver, "Add keyframe")
    _drag(driver, 160)
    _settled_frame(driver, n_frame)
    moved = _screenshot(driver)
    assert np.abs(moved[REGION] - shot[REGION]).mean() > 0.02
    _click(driver, "Add keyframe")
    _wait_text(driver, r"2 keyframes")
    for label, value in (("Seconds", "0.2"), ("FPS", "10"), ("Width", "32"), ("Height", "24")):
        _type(driver, label, value)
    time.sleep(0.5)
    _click(driver, "Export camera path")
    path = Path(_wait_text(driver, r"written to (\S+camera_path\.json)").group(1))
    assert path == page["dir"] / "camera_path.json"
    doc = json.loads(path.read_text())
    assert len(doc["camera_path"]) == 2 and (doc["render_width"], doc["render_height"]) == (32, 24)

    try:
        out = page["dir"] / "render"
        info = render_video(
            compose_app_config("render", [f"ckpt={trained_run[0]}", f"camera_path={path}"], out)
        )
    finally:
        GlobalHydra.instance().clear()
    frames = iio.imread(out / "rgb.mp4")
    assert info["frames"] == 2 and frames.shape == (2, 24, 32, 3)
    # the path starts where the page opened: training view 0, at the path's size
    start = scene.render(type(cam)(cam.c2w, cam.fov_y, 32 / 24, 32), 32)["rgb"]
    assert np.abs(frames[0].astype(float) - start).mean() < 8
    assert np.abs(frames[1].astype(float) - start).mean() > 4  # and moves
