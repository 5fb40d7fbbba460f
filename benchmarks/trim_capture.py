"""A smaller copy of a Blender-layout capture for a GPU call whose carried tree must stay under 64 MiB.

    python -m benchmarks.trim_capture .devdata/lego .devdata/ab/lego --train 60 --val 2 --test 2

Each ``transforms_<split>.json`` keeps its first N frames (its other keys unchanged), and only the images
those frames name are copied. A split without a transforms file is skipped; DEST must not exist.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

__all__ = ["main", "trim"]


def trim(source: Path, dest: Path, frames: dict[str, int]) -> int:
    """Copy ``source`` to ``dest`` with the first ``frames[split]`` frames of each split; returns the number
    of images copied."""
    if dest.exists():
        raise FileExistsError(f"{dest}: exists; expected a new folder")
    images: set[str] = set()
    kept: dict[str, dict] = {}
    for split, n in frames.items():
        path = source / f"transforms_{split}.json"
        if not path.is_file():
            continue
        transforms = json.loads(path.read_text())
        transforms["frames"] = transforms["frames"][:n]
        images |= {frame["file_path"] for frame in transforms["frames"]}
        kept[split] = transforms
    if not kept:
        raise FileNotFoundError(f"{source}: no transforms_<split>.json; expected a Blender-layout capture")
    for name in sorted(images):
        named = source / name  # Blender's file_path may leave the extension out
        found = [p for p in (named, *named.parent.glob(named.name + ".*")) if p.is_file()]
        if not found:
            raise FileNotFoundError(f"{named}: the image a frame names is missing")
        for image in found[:1]:
            target = dest / image.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(image, target)
    for split, transforms in kept.items():
        (dest / f"transforms_{split}.json").write_text(json.dumps(transforms, indent=1))
    return len(images)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    for split, default in (("train", 60), ("val", 2), ("test", 2)):
        parser.add_argument(f"--{split}", type=int, default=default, help=f"{split} frames kept ({default})")
    args = parser.parse_args(argv)
    try:
        n = trim(args.source, args.dest, {"train": args.train, "val": args.val, "test": args.test})
    except (FileExistsError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{args.dest}: {n} images")
    return 0


if __name__ == "__main__":
    sys.exit(main())
