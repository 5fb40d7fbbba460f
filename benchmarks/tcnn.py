"""tiny-cuda-nn's hash grid side by side with our CUDA kernels, measured in the same run.

    python -m benchmarks.tcnn [--quick] [--json PATH] [--markdown PATH] [--lego PATH]
        [--lego-seconds 60] [--dry-run]

Rows, each for ``model.net.backend`` cuda (ours) and tcnn, fp32 and fp16 tables:

- hash encoding forward+backward (instant-ngp's grid: L=16, F=2, T=2^19, 16..2048) at 2^18 and 2^20
  points, points/s (medians of CUDA-event timings after warm-up);
- the training step (``models/train_step.py``: the fixed 2^18-sample budget, field, compositing,
  loss, backward, Adam) at the default precision (``bf16-mixed`` on this GPU) and at 32, eager and as
  CUDA graphs (as training runs it), steps/s; a backend whose step cannot be captured says why;
- with ``--lego PATH``: lego trained for ``--lego-seconds`` (60) per backend through
  ``bench.curve`` (held-out PSNR, steps/s), the default recipe otherwise.

Without tinycudann (or a GPU) the tcnn rows say why and ours are measured alone; ``--dry-run`` runs
every row at toy sizes on whatever device there is (the CPU: the torch encoding stands in for ours),
to check the script, not to measure. Prints the table last; ``--markdown`` writes it for
BENCHMARKS.md with the command, and the line for ``ops.TCNN_FASTER_ON`` when tcnn won.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nerf_lightning.bench.ops import timeit
from nerf_lightning.ops import tcnn

#: instant-ngp's grid over the unit cube (lego), as the default field builds it
GRID = dict(
    n_levels=16, n_features_per_level=2, log2_hashmap_size=19, base_resolution=16, max_resolution=2048
)
#: the grid of ``--dry-run``: every code path at a size a CPU runs in seconds
DRY_GRID = dict(
    n_levels=4, n_features_per_level=2, log2_hashmap_size=12, base_resolution=4, max_resolution=64
)


def backends(device: torch.device) -> dict[str, str | None]:
    """Backend name -> None when it runs here, else why not (ours is the torch encoding on a CPU)."""
    why_tcnn = "no CUDA GPU" if device.type != "cuda" else tcnn.available()
    return {"cuda" if device.type == "cuda" else "torch": None, "tcnn": why_tcnn}


def bench_encoding(device: torch.device, sizes: list[int], iters: int, grid: dict) -> list[dict[str, Any]]:
    from nerf_lightning.models.encoding import HashEncoding

    rows = []
    for log2n in sizes:
        n = 1 << log2n
        x = torch.rand(n, 3, device=device)
        for dtype in (torch.float32, torch.float16):
            row: dict[str, Any] = {
                "name": f"hash enc fwd+bwd 2^{log2n} pts, {str(dtype)[6:]} table",
                "unit": "pts/s",
            }
            for backend, why in backends(device).items():
                if why is not None:
                    row[backend] = why
                    continue
                enc = HashEncoding(**grid, backend=backend, param_dtype=dtype).to(device)
                g = torch.randn(n, enc.n_output_dims, device=device)

                def step(enc: HashEncoding = enc, x: torch.Tensor = x, g: torch.Tensor = g) -> None:
                    enc.params.grad = None
                    enc(x).backward(g)

                row[backend] = n / timeit(step, iters=iters)
            rows.append(row)
    return rows


def make_step(
    backend: str, device: torch.device, precision: str, graphed: bool, budget: int, grid: dict
) -> Callable[[], None]:
    """One optimizer step of the budgeted training step on a shell-shaped occupancy grid."""
    from nerf_lightning.data.ray_batch import RayBatch
    from nerf_lightning.models.field import NGPField
    from nerf_lightning.models.train_step import TrainStep, autocast_for, capture
    from nerf_lightning.volume.occupancy import OccupancyGrid
    from nerf_lightning.volume.renderer import Renderer

    torch.manual_seed(0)
    field = NGPField(aabb_scale=1, encoding=grid, backend=backend).to(device)
    grid = OccupancyGrid(aabb_scale=1, resolution=128).to(device)
    ax = (torch.arange(128, device=device) + 0.5) / 128 - 0.5
    r = (ax[:, None, None] ** 2 + ax[None, :, None] ** 2 + ax[None, None, :] ** 2).sqrt()
    grid.binaries[0] = (r > 0.2) & (r < 0.35)
    step = TrainStep(
        field, Renderer(grid, backend=field.backend), sample_budget=budget, march_budget=4 * budget
    ).to(device)
    gen = torch.Generator(device=device).manual_seed(1)
    n_slots = max(64, budget // 4)
    o = (
        torch.nn.functional.normalize(torch.randn(n_slots, 3, device=device, generator=gen), dim=-1) * 1.5
        + 0.5
    )
    d = torch.nn.functional.normalize(
        0.5 + 0.3 * torch.rand(n_slots, 3, device=device, generator=gen) - o, dim=-1
    )
    zeros = torch.zeros(n_slots, dtype=torch.int64, device=device)
    rgb = torch.rand(n_slots, 3, device=device, generator=gen)
    background = torch.rand(n_slots, 3, device=device)
    batch = RayBatch(o, d, rgb, background, zeros, px=zeros, py=zeros)
    opt = torch.optim.Adam(field.parameters(), lr=1e-2, betas=(0.9, 0.99), eps=1e-15)
    run: Any = capture(step, batch, precision) if graphed else step

    def one() -> None:
        with autocast_for(precision):
            loss = run(batch)[0]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return one


def bench_step(device: torch.device, budget: int, iters: int, grid: dict) -> list[dict[str, Any]]:
    from nerf_lightning.utils.precision import resolve_precision

    default = resolve_precision("auto")
    rows = []
    graphs = (False, True) if device.type == "cuda" else (False,)
    modes = [(p, g) for g in graphs for p in dict.fromkeys([default, "32-true"])]
    for precision, graphed in modes:
        name = f"train step 2^{budget.bit_length() - 1} smp, {precision}{', graphs' if graphed else ''}"
        row: dict[str, Any] = {"name": name, "unit": "steps/s"}
        for backend, why in backends(device).items():
            if why is not None:
                row[backend] = why
                continue
            if graphed:  # in a child process: a capture that fails inside tcnn aborts its process
                row[backend] = graphed_step_in_child(backend, precision, budget, iters, grid is DRY_GRID)
                continue
            try:
                one = make_step(backend, device, precision, graphed, budget, grid)
                row[backend] = 1.0 / timeit(one, warmup=5, iters=iters)
            except Exception as exc:
                row[backend] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        rows.append(row)
    return rows


def bench_lego(path: str, seconds: float, out: Path, graph_ok: dict[str, bool]) -> list[dict[str, Any]]:
    """lego for ``seconds`` of training per backend, each ``bench.curve`` run in its own process (a
    backend that fails cannot leave this process's CUDA context broken for the next)."""
    row: dict[str, Any] = {"name": f"lego {seconds:g} s: PSNR dB / steps/s", "unit": "dB, steps/s"}
    rate = 380.0  # a first guess of lego's steps/s (BENCHMARKS.md); the second run starts from the first's
    for backend in ("cuda", "tcnn"):
        overrides = [
            "experiment=blender",
            f"data.path={path}",
            "logger=csv",
            f"model.net.backend={backend}",
        ]
        if not graph_ok.get(backend, True):
            overrides.append("model.cuda_graph=false")
        argv = [sys.executable, "-m", "nerf_lightning.bench.curve", "--checkpoints", f"{seconds:g}"]
        argv += ["--rate", f"{rate:g}", "--tolerance", "0.25", "--out", str(out / backend), "--", *overrides]
        row[f"{backend}_command"] = " ".join(argv[1:])
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=4 * seconds + 240)
        except subprocess.TimeoutExpired:
            row[backend] = f"failed: over {4 * seconds + 240:g} s"
            continue
        curve_json = out / backend / "curve.json"
        if proc.returncode != 0 or not curve_json.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            row[backend] = f"failed (rc {proc.returncode}): {tail[0][:160]}"
            continue
        (pt,) = json.loads(curve_json.read_text())["points"]
        rate = pt["steps_per_s"]
        psnr = "-" if pt["psnr"] is None else f"{pt['psnr']:.2f}"
        row[backend] = f"{psnr} / {pt['steps_per_s']:.0f}"
    return [row]


def _cell(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def table(rows: list[dict[str, Any]], ours: str) -> list[str]:
    lines = [
        f"| benchmark | unit | {ours} (ours) | tcnn | tcnn / ours |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for r in rows:
        a, b = r.get(ours), r.get("tcnn")
        ratio = f"{b / a:.2f}x" if isinstance(a, float) and isinstance(b, float) else "-"
        lines.append(f"| {r['name']} | {r['unit']} | {_cell(a)} | {_cell(b)} | {ratio} |")
    return lines


def graphed_step_in_child(backend: str, precision: str, budget: int, iters: int, dry: bool) -> float | str:
    """Steps/s of the graphed training step, measured by ``--graphed-step`` in a fresh interpreter, or
    ``failed: ...`` with the child's exit status and last line (a crash in native code included)."""
    argv = [sys.executable, "-m", "benchmarks.tcnn", "--graphed-step", backend, precision,
            "--budget", str(budget), "--iters", str(iters), *(["--dry-run"] if dry else [])]  # fmt: skip
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "failed: the graphed step did not finish in 600 s"
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    if proc.returncode == 0 and proc.stdout.strip():
        try:
            return float(proc.stdout.strip().splitlines()[-1].split()[-1])
        except ValueError:
            pass
    last = next((ln for ln in reversed(lines) if ln.strip()), "no output")
    what = next((ln.strip() for ln in lines if "what():" in ln or "Error" in ln), last)
    return f"failed: exit {proc.returncode}: {what[:120]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    ap.add_argument("--dry-run", action="store_true", help="toy sizes on any device: checks the script only")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None, help="write the table for BENCHMARKS.md here")
    ap.add_argument(
        "--lego", default=None, help="lego's folder: also train it for --lego-seconds per backend"
    )
    ap.add_argument("--lego-seconds", type=float, default=60.0)
    ap.add_argument("--out", type=Path, default=Path("outputs/bench/tcnn"), help="run folders of --lego")
    # the child of graphed_step_in_child: one graphed step's steps/s on the last line
    ap.add_argument("--graphed-step", nargs=2, metavar=("BACKEND", "PRECISION"), help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=int, default=1 << 18, help=argparse.SUPPRESS)
    ap.add_argument("--iters", type=int, default=20, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_float32_matmul_precision("high")  # as `python -m nerf_lightning.train`
    if args.graphed_step:
        backend, precision = args.graphed_step
        grid = DRY_GRID if args.dry_run else GRID
        one = make_step(backend, device, precision, True, args.budget, grid)
        print(f"steps/s {1.0 / timeit(one, warmup=5, iters=args.iters)}")
        return 0
    if device.type != "cuda" and not args.dry_run:
        print("bench.tcnn measures on an NVIDIA GPU; --dry-run checks the script here", file=sys.stderr)
        return 2
    avail = backends(device)
    for name, why in avail.items():
        print(f"[bench.tcnn] {name}: {'runs' if why is None else why}", flush=True)
    small = args.dry_run
    iters = 3 if small or args.quick else 20
    grid = DRY_GRID if small else GRID
    rows = bench_encoding(device, [10, 12] if small else [18, 20], iters, grid)
    rows += bench_step(device, 1 << 10 if small else 1 << 18, iters, grid)
    graphed = [r for r in rows if "graphs" in r["name"]]
    graph_ok = {b: all(not str(r.get(b, "")).startswith("failed") for r in graphed) for b in ("cuda", "tcnn")}
    if args.lego:
        rows += bench_lego(args.lego, args.lego_seconds, args.out, graph_ok)
    ours = next(iter(avail))
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (dry run)"
    command = "python -m benchmarks.tcnn " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = [f"{dt.date.today()} on {gpu}, torch {torch.__version__}: `{command}`", "", *table(rows, ours)]
    steps = [r for r in rows if r["name"].startswith("train step") and "graphs" in r["name"]]
    faster = bool(steps) and all(isinstance(r.get("tcnn"), float) and r["tcnn"] > r[ours] for r in steps)
    if faster:
        best = min(r["tcnn"] / r[ours] for r in steps)
        entry = f'"{gpu}": "{best:.2f}x our training step ({dt.date.today()})"'
        verdict = "tcnn is faster in every graphed training step here: if tests/models/test_encoding_tcnn.py"
        lines += ["", f"{verdict} passed, add `{entry}` to ops.TCNN_FASTER_ON"]
    else:
        lines += [
            "",
            "auto keeps our kernels here: tcnn is not faster in every graphed training step (or did not run)",
        ]
    print("\n".join(lines))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text("\n".join(lines) + "\n")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"gpu": gpu, "torch": torch.__version__, "command": command, "rows": rows}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
