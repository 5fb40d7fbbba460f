"""The README's viewer screenshot (``docs/images/viewer.png``): a page of a running viewer in headless
Chromium, taken once its frame is complete and has stayed so for a while.

    python -m nerf_lightning.train ckpt_path=RUN/checkpoints/last.ckpt trainer.max_steps=2000 viewer=on \\
        viewer.max_size=512 viewer.budget=0.5 hydra.run.dir=/tmp/live &      # prints "viewer: URL ..."
    python scripts/viewer_screenshot.py URL docs/images/viewer.png --size 1280x800

Needs Debian's ``chromium`` and ``chromedriver`` and the dev extra's ``selenium`` (as
``tests/viewer/test_browser.py``). ``--panel-text`` waits until the training panel shows that text
(a regular expression), e.g. ``"training PSNR"``.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
)  # fmt: skip


def _body(driver: webdriver.Chrome) -> str:
    return driver.find_element(By.TAG_NAME, "body").text


def settled_frame(driver: webdriver.Chrome, hold_s: float, timeout_s: float) -> str:
    """The status line of a complete frame (``frame N · WxH``) that stays the page's last for ``hold_s``."""
    end = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while time.monotonic() < end:
        m = re.search(r"frame \d+ · \d+x\d+", _body(driver))
        key = m.group(0) if m else None
        if key != last:
            last, since = key, time.monotonic()
        elif m and time.monotonic() - since > hold_s:
            return m.group(0)
        time.sleep(0.2)
    raise SystemExit(f"error: no settled frame within {timeout_s:.0f} s; the page shows {last!r}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", default="1280x800", help="browser window WxH")
    ap.add_argument("--panel-text", default=None, help="wait until the page shows this (regex)")
    ap.add_argument("--hold-s", type=float, default=3.0, help="seconds the frame must stay complete")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    args = ap.parse_args(argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if not (chromium and chromedriver):
        print(
            "error: needs chromium and chromedriver (apt-get install chromium chromium-driver)",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory() as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in (*FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=Service(chromedriver))
        try:
            driver.set_page_load_timeout(60)
            driver.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            )
            driver.get(args.url)
            end = time.monotonic() + args.timeout_s
            while args.panel_text and not re.search(args.panel_text, _body(driver)):
                if time.monotonic() > end:
                    raise SystemExit(f"error: the page never showed {args.panel_text!r}")
                time.sleep(0.5)
            for close in driver.find_elements(By.CSS_SELECTOR, "button[class*='mantine-Notification-close']"):
                close.click()  # the software-WebGL notice
            frame = settled_frame(driver, args.hold_s, args.timeout_s)
            time.sleep(0.5)  # a few animation frames after the last change
            args.out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(args.out))
        finally:
            driver.quit()
    print(f"{args.out}: {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
