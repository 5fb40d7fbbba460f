"""The prepared GPU calls of issue 61: what each carries, its command, and the carried size.

    python -m benchmarks.gpu_calls show [NAME ...]               # command, carry list, timeouts
    python -m benchmarks.gpu_calls prepare NAME [--data ../shared/data] [--wheels ../shared/device-wheels]

A call is one ``run`` of the GPU machine: one bash command of at most ``MAX_COMMAND`` characters, at most 9
minutes of work (each script ends its steps by ``DEADLINE_S``, and an outer ``timeout`` backs it up), and a
working tree of at most 64 MiB: the checkout's files that git does not ignore, plus the carried paths.
``prepare`` fills those paths (git-ignored: ``.whl/``, ``.devdata/``) from the shared data and wheels,
then measures what would travel and fails when it is over the limit:

- ``mesh`` (issue 48, ``benchmarks/mesh_gpu.sh``): lego_official's 100 training views and its first 4 test
  views (``.devdata/lego_official_t4``: the export scores held-out views against the field's renders, so
  the other test images are not needed), fox with its photographs re-encoded at JPEG quality
  ``FOX_QUALITY`` at full size (``.devdata/fox_q85``: the original 18.4 MB would put the call over 64 MiB
  beside lego and embree), and the export's wheels (``.devdata/mesh-wheels``, downloaded with pip).
- ``storage`` (issue 49, ``benchmarks/big_captures_gpu.sh``): lego_official as it is (50 test views).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MAX_COMMAND = 2000
LIMIT_BYTES = 64 * 2**20
CALL_S = 540  # 9 minutes: what a call may take
OUTER_TIMEOUT_S = 580  # the command's own backstop, inside the run's timeout_s
RUN_TIMEOUT_S = 600
FOX_QUALITY = 85
LEGO_TEST_VIEWS = 4  # r_0, r_4, r_8, r_12: view 3 is the README picture's camera
#: the export's packages for Python 3.12 on x86-64 (benchmarks/mesh_gpu.sh)
#: (trimesh's ray casting through embree; rtree, its fallback, is not needed beside embreex)
MESH_WHEELS = ("xatlas==0.0.11", "fast-simplification==0.2.0", "PyMCubes==0.1.6", "trimesh==5.2.0",
               "embreex==4.4.0.post1")  # fmt: skip
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")  # fmt: skip


@dataclass(frozen=True)
class Call:
    name: str
    issue: int
    script: str
    args: str
    env: str
    carry: tuple[str, ...]
    minutes: float  # expected device minutes of the command, without the machine's start

    @property
    def command(self) -> str:
        env = f"{self.env} " if self.env else ""
        return f'{env}timeout {OUTER_TIMEOUT_S} bash {self.script} {self.args} "$OUT"'


CALLS = {
    c.name: c
    for c in (
        Call("mesh", 48, "benchmarks/mesh_gpu.sh", ".devdata/lego_official_t4 .devdata/fox_q85",
             'WHEELS=".whl .devdata/mesh-wheels"',
             (".whl", ".devdata/mesh-wheels", ".devdata/lego_official_t4", ".devdata/fox_q85"), 6.5),
        Call("storage", 49, "benchmarks/big_captures_gpu.sh", ".devdata/lego_official", "",
             (".whl", ".devdata/lego_official"), 8.5),
    )
}  # fmt: skip


def tree_bytes(repo: Path) -> int:
    """Bytes of the files that travel without being carried: tracked and untracked-not-ignored ones."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                         check=True, capture_output=True).stdout  # fmt: skip
    files = {repo / name for name in out.decode().split("\0") if name}
    return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())


def path_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def carried_bytes(repo: Path, call: Call) -> dict[str, int]:
    """Per carried path and for the tree, the bytes that travel; ``total`` their sum."""
    sizes = {"tree": tree_bytes(repo), **{p: path_bytes(repo / p) for p in call.carry}}
    sizes["total"] = sum(sizes.values())
    return sizes


def _copy(src: Path, dst: Path) -> None:
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    for f in [dst, *dst.rglob("*")]:  # the shared copies are read-only; ours need not be
        f.chmod(0o755 if f.is_dir() else 0o644)


def lego_subset(src: Path, dst: Path, test_views: int = LEGO_TEST_VIEWS) -> None:
    """The training split whole and the first ``test_views`` frames of the test split."""
    if dst.exists():
        shutil.rmtree(dst)
    (dst / "test").mkdir(parents=True)
    shutil.copytree(src / "train", dst / "train")
    shutil.copy(src / "transforms_train.json", dst)
    doc = json.loads((src / "transforms_test.json").read_text())
    doc["frames"] = doc["frames"][:test_views]
    for frame in doc["frames"]:
        shutil.copy(src / frame["file_path"], dst / frame["file_path"])
    (dst / "transforms_test.json").write_text(json.dumps(doc, indent=1))


def reencode_jpegs(src: Path, dst: Path, quality: int = FOX_QUALITY) -> None:
    """A copy of an instant-ngp capture with its JPEGs re-encoded at ``quality`` (same size, same names)."""
    from PIL import Image

    _copy(src, dst)
    for f in sorted(dst.rglob("*.jp*g")):
        with Image.open(f) as im:
            im.load()
            exif = im.info.get("exif", b"")
            im.save(f, "JPEG", quality=quality, exif=exif)


def download_mesh_wheels(dst: Path) -> None:
    have = {w.name.split("-")[0].lower().replace("_", "-") for w in dst.glob("*.whl")}
    wanted = [w for w in MESH_WHEELS if w.split("==")[0].lower().replace("_", "-") not in have]
    if not wanted:
        return
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    target = ["--python-version", "3.12", "--implementation", "cp", *platforms]
    subprocess.run([*pip, *target, "-d", str(dst), *wanted], check=True)


def prepare(
    repo: Path, call: Call, data: Path, wheels: Path, fox_quality: int = FOX_QUALITY
) -> dict[str, int]:
    """Fill the call's carried paths under ``repo``; returns :func:`carried_bytes`."""
    whl = repo / ".whl"
    whl.mkdir(exist_ok=True)
    for w in wheels.glob("*.whl"):
        shutil.copy(w, whl / w.name)
    dev = repo / ".devdata"
    dev.mkdir(exist_ok=True)
    if call.name == "mesh":
        (dev / "mesh-wheels").mkdir(exist_ok=True)
        download_mesh_wheels(dev / "mesh-wheels")
        lego_subset(data / "lego_official", dev / "lego_official_t4")
        reencode_jpegs(data / "fox", dev / "fox_q85", fox_quality)
    else:
        _copy(data / "lego_official", dev / "lego_official")
    return carried_bytes(repo, call)


def describe(call: Call, sizes: dict[str, int] | None = None) -> str:
    lines = [f"## {call.name} (issue {call.issue}): about {call.minutes:g} min of device time",
             f"command ({len(call.command)} chars): {call.command}",
             f"carry: {json.dumps(list(call.carry))}", f"timeout_s: {RUN_TIMEOUT_S}"]  # fmt: skip
    if sizes:
        parts = ", ".join(f"{k} {v / 2**20:.1f}" for k, v in sizes.items() if k != "total")
        lines.append(f"carried: {sizes['total'] / 2**20:.1f} MiB of {LIMIT_BYTES / 2**20:.0f} ({parts})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_calls", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show")
    s.add_argument("names", nargs="*", help=f"of {', '.join(CALLS)} (default: all)")
    s.add_argument("--sizes", action="store_true", help="measure what the carried paths hold now")
    r = sub.add_parser("prepare")
    r.add_argument("name", choices=list(CALLS))
    r.add_argument("--data", type=Path, default=Path("../shared/data"))
    r.add_argument("--wheels", type=Path, default=Path("../shared/device-wheels"))
    r.add_argument("--fox-quality", type=int, default=FOX_QUALITY, help="mesh: fox's JPEG quality")
    args = p.parse_args(argv)
    repo = Path.cwd()
    if args.cmd == "show":
        unknown = sorted(set(args.names) - set(CALLS))
        if unknown:
            p.error(f"unknown calls {unknown}: {', '.join(CALLS)}")
        for name in args.names or CALLS:
            call = CALLS[name]
            print(describe(call, carried_bytes(repo, call) if args.sizes else None) + "\n")
        return 0
    call = CALLS[args.name]
    sizes = prepare(repo, call, args.data, args.wheels, args.fox_quality)
    print(describe(call, sizes))
    if sizes["total"] > LIMIT_BYTES:
        over = f"{sizes['total'] / 2**20:.1f} MiB would travel, over the 64 MiB limit"
        print(f"gpu_calls: {over} (mesh: a lower --fox-quality)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
