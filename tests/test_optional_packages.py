"""A machine without the viewer's packages (viser and what it brings) or trimesh collects the suite
without errors: the tests that need them skip, the others (the config tests among them) run."""

from __future__ import annotations

import re
import subprocess
import sys

from runs import REPO_ROOT, child_env

#: the test files that import the viewer or trimesh, directly or through the package's modules
NEED_THEM = [
    "tests/test_config_defaults.py",
    "tests/test_config_keys.py",
    "tests/mesh",
    "tests/viewer",
    "tests/benchmarks/test_viewer_bench.py",
]

#: a child that sees these packages as missing: `import` raises ModuleNotFoundError and
#: importlib.util.find_spec answers None, as on a machine that lacks them
COLLECT_WITHOUT = """
import sys
import pytest
for name in ("viser", "websockets", "msgspec", "trimesh"):
    sys.modules[name] = None
sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
"""


def test_the_suite_collects_without_the_viewer_and_mesh_packages() -> None:
    done = subprocess.run(
        [sys.executable, "-c", COLLECT_WITHOUT, *NEED_THEM],
        cwd=REPO_ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    # pytest's lines for a module that failed to import: "ERROR tests/..." and "... 9 errors in ..."
    assert done.returncode == 0 and not re.search(r"^ERROR|\d+ errors? in", out, re.M), out[-4000:]
    assert "could not import 'viser'" in out and "could not import 'trimesh'" in out, out[-4000:]
    # the config tests and the viewer's own viser-free tests are collected, not skipped
    for module in ("test_config_defaults.py", "test_config_keys.py", "viewer/test_training_panel.py"):
        assert f"tests/{module}::" in out, module
