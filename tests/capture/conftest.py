"""What the tests of the process app share."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra

import nerf_lightning.apps.process as app
from nerf_lightning.run.config import compose_app_config


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``run(*overrides, sfm=fake)``: the app's ``process(cfg)`` into ``tmp_path/run``, with ``sfm`` (when
    given) in place of its solver."""

    def _run(*overrides: str, sfm=None):
        if sfm is not None:
            monkeypatch.setattr(app, "run_sfm", sfm)
        try:
            return app.process(compose_app_config("process", list(overrides), tmp_path / "run"))
        finally:
            GlobalHydra.instance().clear()

    return _run
