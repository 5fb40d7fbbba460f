"""Issue 47's decision on learned poses and per-view exposure, from the runs of learned_views_gpu.sh.

    python -m benchmarks.learned_views collect WORK [--out results.jsonl]
    python -m benchmarks.learned_views decide results.jsonl [--json decision.json]

``collect``: one JSON row per run folder ``WORK/<scene>_<variant>`` (its metrics.json and CSV log): the plain
held-out PSNR (``val/psnr``), the fair protocol's (``val/psnr_fitted``: each held-out view's pose and
exposure fitted with the field frozen), the training PSNR (the mean of ``train/psnr`` over the last
``TRAIN_WINDOW`` logged points: one batch is noisy), steps, and the corrections' sizes.

``decide``: the rule of issue 61. A correction (``camera_opt``, ``appearance``) becomes the default for
photographs only if, on the fair metric and against ``off`` at the same seed, it gains at least
``MIN_GAIN`` dB on the mean over the captures and loses no more than ``MAX_LOSS`` dB on any capture.
Both pass alone: both are adopted if the ``both`` run passes too, else the one with the larger mean gain.
Otherwise a correction stays off, "for captures whose poses or exposure are known to be off". Prints a
table of the per-capture changes and the decision; exits 1 when a correction could not be decided (its
run or ``off`` lacks the fair metric on a capture: missing, failed or cut short).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

#: the learned corrections, each a variant of the runs, and their overrides
CORRECTIONS: dict[str, tuple[str, ...]] = {
    "camera_opt": ("model.camera_opt.enabled=true",),
    "appearance": ("model.appearance.enabled=true",),
}
VARIANTS: dict[str, tuple[str, ...]] = {
    "off": (),
    **CORRECTIONS,
    "both": (*CORRECTIONS["camera_opt"], *CORRECTIONS["appearance"]),
}
FAIR = "val/psnr_fitted"
MIN_GAIN = 0.2  # dB, on the mean over the captures
MAX_LOSS = 0.1  # dB, on each capture
OFF_NOTE = "false (for captures whose poses or exposure are known to be off)"
TRAIN_WINDOW = 10  # logged train/psnr points averaged (log_every_n_steps=50: the last 500 steps)
METRIC_KEYS = (
    "val/psnr", "val/psnr_fitted", "val/ssim", "val/ssim_fitted", "eval/psnr", "eval/psnr_fitted",
    "eval/split", "eval/n_views", "steps", "time/train_s", "camera_opt/rotation_deg_mean",
    "camera_opt/translation_mean", "appearance/stops_std",
)  # fmt: skip


def train_psnr(run_dir: Path, window: int = TRAIN_WINDOW) -> tuple[float | None, float | None]:
    """(mean of the last ``window`` logged ``train/psnr`` values, the last one) from the run's CSV log."""
    values: list[float] = []
    for path in sorted(run_dir.glob("**/metrics.csv")):
        with path.open(newline="") as f:
            values += [float(r["train/psnr"]) for r in csv.DictReader(f) if r.get("train/psnr")]
    if not values:
        return None, None
    tail = values[-window:]
    return sum(tail) / len(tail), values[-1]


def collect_run(run_dir: Path, scene: str, variant: str, seed: int) -> dict[str, Any]:
    """One run's row (``exit`` comes from the script's record when it has one)."""
    row: dict[str, Any] = {"scene": scene, "variant": variant, "seed": seed}
    metrics_path = run_dir / "metrics.json"
    if metrics_path.is_file():
        metrics = json.loads(metrics_path.read_text())
        row.update({k: metrics[k] for k in METRIC_KEYS if k in metrics})
    mean, last = train_psnr(run_dir)
    row["train/psnr_mean"], row["train/psnr_last"] = mean, last
    return row


def collect(work: Path, seed: int, steps_tsv: Path | None = None) -> list[dict[str, Any]]:
    """Rows of every ``<scene>_<variant>`` folder under ``work``, with the exit status and seconds that
    ``steps_tsv`` (gpu_common.sh's record) gives for the step of that name."""
    record: dict[str, tuple[str, int]] = {}
    if steps_tsv is not None and steps_tsv.is_file():
        for line in steps_tsv.read_text().splitlines():
            name, status, secs = line.split("\t")
            record[name] = (status, int(secs))
    rows = []
    for run_dir in sorted(p for p in work.iterdir() if p.is_dir() and "_" in p.name):
        scene, _, variant = run_dir.name.partition("_")
        if variant not in VARIANTS:
            continue
        row = collect_run(run_dir, scene, variant, seed)
        if run_dir.name in record:
            row["exit"], row["wall_s"] = record[run_dir.name]
        rows.append(row)
    return rows


@dataclass
class Verdict:
    """One correction (or ``both``) against ``off``: per-capture changes of the fair metric, and the rule."""

    correction: str
    deltas: dict[str, float]
    mean: float
    passes: bool


def judge(rows: list[dict[str, Any]], metric: str = FAIR) -> dict[str, Verdict]:
    """Each variant's change of ``metric`` against ``off`` of the same capture, and the rule; a variant
    without a finite ``metric`` on every capture (a run missing, failed or cut short) has no verdict."""
    scores: dict[tuple[str, str], float] = {}
    for r in rows:
        value = r.get(metric)
        if value is not None and math.isfinite(float(value)):
            scores[(r["scene"], r["variant"])] = float(value)
    scenes = sorted({r["scene"] for r in rows})
    out = {}
    for variant in (*CORRECTIONS, "both"):
        if not scenes or any((s, "off") not in scores or (s, variant) not in scores for s in scenes):
            continue
        deltas = {s: scores[(s, variant)] - scores[(s, "off")] for s in scenes}
        mean = sum(deltas.values()) / len(deltas)
        passes = mean >= MIN_GAIN - 1e-9 and min(deltas.values()) >= -MAX_LOSS - 1e-9
        out[variant] = Verdict(variant, deltas, mean, passes)
    return out


def decide(verdicts: dict[str, Verdict]) -> dict[str, bool | None]:
    """The default for photographs of each correction under the rule of the module docstring: True (on),
    False (off), None (no verdict: not decided). Two passing corrections are both adopted only if the
    ``both`` run passes too (no verdict for it: the one with the larger mean gain)."""
    passing = [c for c in CORRECTIONS if c in verdicts and verdicts[c].passes]
    both = verdicts.get("both")
    if len(passing) == 2 and not (both is not None and both.passes):
        passing = [max(passing, key=lambda c: verdicts[c].mean)]
    return {c: (c in passing) if c in verdicts else None for c in CORRECTIONS}


def report(rows: list[dict[str, Any]], verdicts: dict[str, Verdict], chosen: dict[str, bool | None]) -> str:
    """The rows, the changes against off and the decision, as text."""
    lines = [
        f"| capture | variant | val/psnr | {FAIR} (fair) | training PSNR (mean of {TRAIN_WINDOW}) | steps |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]

    def num(v: Any) -> str:
        return "-" if v is None else f"{float(v):.2f}"

    for r in sorted(rows, key=lambda r: (r["scene"], list(VARIANTS).index(r["variant"]))):
        cells = (r["scene"], r["variant"], num(r.get("val/psnr")), num(r.get(FAIR)),
                 num(r.get("train/psnr_mean")), r.get("steps", "-"))  # fmt: skip
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines.append("")
    rule = f"(>= +{MIN_GAIN} dB mean, >= -{MAX_LOSS} dB each)"
    for v in verdicts.values():
        per = ", ".join(f"{s} {d:+.2f}" for s, d in v.deltas.items())
        verdict = "passes" if v.passes else "fails"
        lines.append(f"{v.correction}: {per} dB on {FAIR} (mean {v.mean:+.2f}): {verdict} the rule {rule}")
    lines.append("")
    for c, on in chosen.items():
        value = "auto (on for photographs)" if on else OFF_NOTE
        if on is None:
            value = f"not decided: no {FAIR} of off and {c} on every capture"
        lines.append(f"decision: model.{c}.enabled: {value}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.learned_views", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect", help="rows of the run folders under WORK")
    c.add_argument("work", type=Path)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--steps-tsv", type=Path, default=None, help="gpu_common.sh's record of the steps")
    c.add_argument("--out", type=Path, default=None, help="write the rows there (JSON lines)")
    d = sub.add_parser("decide", help="apply the decision rule to collected rows")
    d.add_argument("results", type=Path)
    d.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.cmd == "collect":
        rows = collect(args.work, args.seed, args.steps_tsv)
        text = "".join(json.dumps(r) + "\n" for r in rows)
        if args.out is not None:
            args.out.write_text(text)
        print(text, end="")
        return 0
    rows = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    verdicts = judge(rows)
    chosen = decide(verdicts)
    print(report(rows, verdicts, chosen))
    if args.json is not None:
        doc = {"rule": {"metric": FAIR, "min_mean_gain_db": MIN_GAIN, "max_loss_db": MAX_LOSS},
               "verdicts": {k: asdict(v) for k, v in verdicts.items()}, "defaults": chosen}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if None not in chosen.values() else 1


if __name__ == "__main__":
    raise SystemExit(main())
