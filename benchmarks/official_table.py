"""The table of ``benchmarks/official_gpu.sh``: one row per run found in its work folder.

    python -m benchmarks.official_table WORK [--json OUT.json]

A fixed-step run (``WORK/NAME/metrics.json``) gives one row; a timed ``bench.curve`` run
(``WORK/NAME/curve.json``) one row per time point (``NAME@60s``). Columns: steps, training seconds,
steps/s, and PSNR on the test views over white (the headline: sRGB over white), over black in sRGB
(``psnr_black``: the ground truth of instant-ngp's ``run.py --nerf_compatibility``), over black in linear
RGB (``psnr_ngp``: ``run.py`` in instant-ngp's default mode), plus, when the run validated on training views
(``data.val_split=train``), the PSNR of those training views: the gap between the two says how much of what
the field learned holds for views it never saw.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

__all__ = ["main", "rows", "table"]

Row = dict[str, Any]
_COLUMNS = (
    ("run", "run", "{}"), ("steps", "steps", "{:.0f}"), ("train_s", "train_s", "{:.1f}"),
    ("steps/s", "steps_per_s", "{:.1f}"), ("white", "psnr", "{:.3f}"), ("black", "psnr_black", "{:.3f}"),
    ("ngp", "psnr_ngp", "{:.3f}"), ("train_views", "psnr_train_views", "{:.3f}"),
)  # fmt: skip


def _num(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _from_metrics(name: str, m: dict[str, Any]) -> Row:
    """A fixed-step run: the test split's numbers (``test/*``, else ``val/*``, validation having scored
    them); an ``eval split=train`` of a checkpoint: its training views' PSNR alone."""
    if m.get("split") == "train":
        return {"run": name, "psnr_train_views": _num(m.get("train/psnr"))}
    split = "test" if "test/psnr" in m else "val"
    steps, train_s = _num(m.get("steps")), _num(m.get("time/train_s"))
    return {
        "run": name,
        "steps": steps,
        "train_s": train_s,
        "steps_per_s": steps / train_s if steps and train_s else None,
        **{k: _num(m.get(f"{split}/{k}")) for k in ("psnr", "psnr_black", "psnr_ngp")},
        "psnr_train_views": _num(m.get("val/psnr")) if split == "test" else None,
    }


def _from_curve(name: str, curve: dict[str, Any]) -> list[Row]:
    return [
        {
            "run": f"{name}@{p['checkpoint_s']:g}s",
            **{
                k: _num(p.get(k))
                for k in ("steps", "train_s", "steps_per_s", "psnr", "psnr_black", "psnr_ngp")
            },
            "psnr_train_views": None,
        }
        for p in curve.get("points", [])
    ]


def rows(work: Path) -> list[Row]:
    """Every run under ``work``, in name order; a run without results gets a row of its name only."""
    out: list[Row] = []
    for run in sorted(p for p in work.iterdir() if p.is_dir()):
        if (run / "curve.json").is_file():
            out += _from_curve(run.name, json.loads((run / "curve.json").read_text()))
        elif (run / "metrics.json").is_file():
            out.append(_from_metrics(run.name, json.loads((run / "metrics.json").read_text())))
        elif (work / f"{run.name}.log").is_file():
            out.append({"run": f"{run.name} (no results)"})
    return out


def table(result: list[Row]) -> str:
    """A plain-text table, one line per row, ``-`` for a missing value."""
    header = " ".join(f"{h:>12s}" if i else f"{h:<22s}" for i, (h, _, _) in enumerate(_COLUMNS))
    lines = [header]
    for r in result:
        cells = []
        for i, (_, key, fmt) in enumerate(_COLUMNS):
            v = r.get(key)
            text = "-" if v is None else fmt.format(v)
            cells.append(f"{text:<22s}" if i == 0 else f"{text:>12s}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("work", type=Path, help="the work folder of benchmarks/official_gpu.sh")
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    a = p.parse_args(argv)
    result = rows(a.work)
    print(table(result))
    if a.json is not None:
        a.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
