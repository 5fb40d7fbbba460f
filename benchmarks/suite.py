"""The benchmark runner: named experiments, run time-boxed, one results table (every number in BENCHMARKS.md).

    python -m benchmarks.suite --list
    python -m benchmarks.suite NAME [NAME ...] [--dry-run] [--out DIR] [--work DIR] [--data DIR]
        [--limit SECONDS] [--only GLOB] [--ext-cache TGZ] [--rebuild-extension] [--pack-extension]

Each NAME is an experiment of :data:`benchmarks.experiments.EXPERIMENTS`: a list of jobs (training
runs, ``bench.curve``, pytest, any command), each with an expected duration and a hard time box. Jobs run
alone on the machine, or in lanes that share the GPU for fixed-step quality A/Bs (``benchmarks.jobs``). A job
is skipped when less than its expected time is left of ``--limit`` (so the whole call ends in time), when a
capture it needs is missing under ``--data``, or when it needs more GPUs than are visible. A job that
fails or overruns its box gets its exit status and log tail in its row and never stops the other jobs.

Before the first GPU job the CUDA extension is loaded from ``$TORCH_EXTENSIONS_DIR`` (default
``.torch_extensions`` of the working directory), unpacked first from ``--ext-cache`` (default
``.devdata/ext.tgz``) when that folder is empty, or built; ``--pack-extension`` writes the build to
``OUT/ext.tgz`` for the next machine.

Writes into ``--out`` (a handful of files, whatever the number of jobs): ``rows.jsonl`` (one JSON object
per result row, appended as jobs finish, rewritten at the end with the changes against each baseline),
``table.txt`` (the table, rewritten after every job), ``progress.txt`` (one line per event) and
``runs.tgz`` (every job's small outputs: metrics, curve.json, configs, logs). Runs live under ``--work``.
The table is printed last. Exit status 0 when every job ran and succeeded, else 1.
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.jobs import Experiment, Job, module, phases
from benchmarks.readers import Row
from nerf_lightning.utils.io import atomic_write_bytes

#: the repository root, which holds this package (not installed with the wheel)
REPO_ROOT = Path(__file__).resolve().parents[1]

#: The table's columns: (header, row key, format). Speeds of lane jobs are not shown (shared GPU).
COLUMNS = (
    ("job", "id", "{}"), ("mode", "mode", "{}"), ("status", "status", "{}"),
    ("wall_s", "wall_s", "{:.0f}"), ("steps", "steps", "{}"), ("PSNR", "psnr", "{:.3f}"),
    ("dPSNR", "d_psnr", "{:+.3f}"), ("PSNRngp", "psnr_ngp", "{:.3f}"), ("steps/s", "steps_per_s", "{:.1f}"),
    ("x_base", "ratio", "{:.2f}x"),
    ("Mrays/s", "mrays_per_s", "{:.2f}"), ("GPU%", "gpu_util", "{:.0f}"), ("memGB", "mem_gb", "{:.2f}"),
    ("note", "note", "{}"),
)  # fmt: skip
_SPEED_KEYS = ("steps_per_s", "ratio", "mrays_per_s")
_LOG_TAIL = 15


def visible_gpus() -> int:
    """NVIDIA GPUs this process may use (``nvidia-smi -L``, narrowed by ``CUDA_VISIBLE_DEVICES``)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        n = sum(ln.startswith("GPU ") for ln in out.stdout.splitlines()) if out.returncode == 0 else 0
    except (OSError, subprocess.TimeoutExpired):
        n = 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = min(n, len([d for d in visible.split(",") if d.strip()]))
    return n


class GpuSampler(threading.Thread):
    """NVML utilization of GPU 0 once a second, for jobs that report none themselves (pytest, ops)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []
        self._stop_event = threading.Event()
        self._nvml: Any = None
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._nvml = pynvml
        except Exception:  # noqa: BLE001 - no NVML (a CPU machine): no samples
            pass

    def run(self) -> None:
        while self._nvml is not None and not self._stop_event.wait(1.0):
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            self.samples.append((time.time(), float(util)))

    def stop(self) -> None:
        self._stop_event.set()

    def mean(self, t0: float, t1: float) -> float | None:
        vals = [u for t, u in self.samples if t0 <= t <= t1]
        return sum(vals) / len(vals) if vals else None


class Suite:
    """Runs experiments into one results folder (see the module docstring)."""

    def __init__(
        self,
        out: Path,
        work: Path,
        data: Path,
        limit: float | None,
        only: str | None = None,
        dry: bool = False,
    ) -> None:
        self.out, self.work, self.data, self.limit, self.only = out, work, data, limit, only
        self.t0 = time.time()
        self.rows: list[Row] = []
        self.lock = threading.Lock()
        self.children: set[subprocess.Popen] = set()
        self.stopping = threading.Event()
        self.gpus = 0
        self.experiments_started = 0
        self.grace_s = 10.0  # between SIGTERM and SIGKILL of a job that overran its box
        self.sampler: GpuSampler | None = None
        if not dry:  # a dry run writes nothing
            out.mkdir(parents=True, exist_ok=True)
            for name in ("rows.jsonl", "progress.txt"):
                (out / name).write_text("")

    # ---------------------------------------------------------------------------------- bookkeeping
    def left(self) -> float:
        return float("inf") if self.limit is None else self.limit - (time.time() - self.t0)

    def say(self, msg: str) -> None:
        line = f"[t={time.time() - self.t0:5.0f}s] {msg}"
        with self.lock:
            print(line, flush=True)
            with open(self.out / "progress.txt", "a") as f:
                f.write(line + "\n")

    def placeholders(self, exp: Experiment, job: Job) -> dict[str, str]:
        return {
            "python": sys.executable, "data": str(self.data), "work": str(self.work),
            "exp_dir": str(self.work / exp.name), "run_dir": str(self.work / exp.name / job.name),
        }  # fmt: skip

    @staticmethod
    def fill(text: str, values: dict[str, str]) -> str:
        for key, value in values.items():  # only the known names: Hydra's ${...} stays as it is
            text = text.replace("{" + key + "}", value)
        return text

    def command(self, exp: Experiment, job: Job) -> tuple[list[str], dict[str, str]]:
        values = self.placeholders(exp, job)
        return [self.fill(a, values) for a in job.argv], {k: self.fill(v, values) for k, v in job.env.items()}

    def selected(self, exp: Experiment) -> list[Job]:
        return [j for j in exp.jobs if self.only is None or fnmatch.fnmatch(j.name, self.only)]

    def add(self, rows: list[Row]) -> None:
        with self.lock:
            self.rows.extend(rows)
            with open(self.out / "rows.jsonl", "a") as f:
                for row in rows:
                    f.write(json.dumps(row, default=str) + "\n")
            table = format_table(sorted(with_baselines(self.rows), key=lambda r: r["seq"]))
            atomic_write_bytes(self.out / "table.txt", (table + "\n").encode())

    # ------------------------------------------------------------------------------------- one job
    def skip_reason(self, exp: Experiment, job: Job) -> str | None:
        if self.stopping.is_set():
            return "interrupted"
        missing = [d for d in exp.data if not (self.data / d).exists()]
        if missing:
            return f"missing {', '.join(str(self.data / d) for d in missing)} (--data)"
        if job.gpus > self.gpus:
            return f"needs {job.gpus} GPU(s), {self.gpus} visible"
        if self.left() < job.expected_s:
            return f"time: {max(self.left(), 0):.0f} s left of --limit, expects {job.expected_s:.0f} s"
        return None

    def base_row(self, exp: Experiment, job: Job, argv: Sequence[str]) -> Row:
        order = next((i for i, j in enumerate(exp.jobs) if j.name == job.name), len(exp.jobs))
        return {
            "seq": [self.experiments_started, order], "experiment": exp.name, "job": job.name,
            "id": f"{exp.name}/{job.name}",
            "mode": "alone" if job.lane is None else f"lane{job.lane}", "baseline": job.baseline,
            "ratio_of": job.ratio_of, "command": shlex.join(argv),
        }  # fmt: skip

    def run_job(self, exp: Experiment, job: Job) -> list[Row]:
        argv, env = self.command(exp, job)
        row = self.base_row(exp, job, argv)
        reason = self.skip_reason(exp, job)
        if reason is not None:
            row.update(status="skipped", note=reason)
            self.add([row])
            self.say(f"{row['id']} skipped: {reason}")
            return [row]
        run_dir = self.work / exp.name / job.name
        log = self.work / exp.name / f"{job.name}.log"
        shutil.rmtree(run_dir, ignore_errors=True)  # never read an earlier run's results
        run_dir.mkdir(parents=True)
        box = max(1.0, min(job.timeout_s, self.left()))
        self.say(f"{row['id']} start ({row['mode']}, expects {job.expected_s:.0f} s, box {box:.0f} s)")
        start = time.time()
        rc, timed_out = self.execute(argv, {**os.environ, **env}, log, box)
        end = time.time()
        row.update(
            started=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start)), wall_s=end - start, rc=rc
        )
        try:
            results = job.read(run_dir, log) or [{}]
            read_error = None
        except Exception as err:  # noqa: BLE001 - a reader's failure is this job's, not the run's
            results, read_error = [{}], f"{type(err).__name__}: {err}"
        ok = rc == 0 and read_error is None
        status = "timeout" if timed_out else "ok" if ok else "failed"
        sampled = self.sampler.mean(start, end) if self.sampler is not None else None
        rows = []
        for res in results:
            r = {**row, **res, "status": status}
            r["id"] = row["id"] + str(res.get("part", ""))
            if r.get("gpu_util") is None and sampled is not None:
                r["gpu_util"] = sampled
            if r.get("rays_per_s") is not None:
                r["mrays_per_s"] = r["rays_per_s"] / 1e6
            rows.append(r)
        if status != "ok":
            why = f"killed after {box:.0f} s" if timed_out else f"rc={rc}" if rc else read_error
            tail = log.read_text(errors="replace").splitlines()[-_LOG_TAIL:] if log.is_file() else []
            for r in rows:
                r["log_tail"] = tail
                r["note"] = "; ".join(filter(None, [why, (tail or [""])[-1][:120], r.get("note")]))
        self.add(rows)
        first = rows[0]
        shown = f"{first['psnr']:.3f} dB" if first.get("psnr") is not None else first.get("note", "")
        self.say(f"{row['id']} {status} in {end - start:.0f} s: {shown}")
        return rows

    def execute(self, argv: list[str], env: dict[str, str], log: Path, box: float) -> tuple[int, bool]:
        """Run ``argv`` in its own process group with its output in ``log``; SIGTERM the group after
        ``box`` seconds and SIGKILL it 10 s later. Returns (exit status, timed out)."""
        # `python -m benchmarks.<tool>` from any working directory: the repository root on the path
        path = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
        env = {**env, "PYTHONPATH": path}
        with open(log, "wb") as f:
            try:
                proc = subprocess.Popen(
                    argv, stdout=f, stderr=subprocess.STDOUT, env=env, process_group=0
                )
            except OSError as err:
                f.write(f"cannot start {argv[0]}: {err}\n".encode())
                return 127, False
            with self.lock:
                self.children.add(proc)
            try:
                rc = proc.wait(timeout=box)
                timed_out = False
            except subprocess.TimeoutExpired:
                kill_group(proc, self.grace_s)
                rc, timed_out = proc.returncode, True
            finally:
                with self.lock:
                    self.children.discard(proc)
        return rc, timed_out

    # ------------------------------------------------------------------------------------ a whole run
    def run_experiment(self, exp: Experiment) -> None:
        jobs = self.selected(exp)
        self.experiments_started += 1
        self.say(f"== {exp.name}: {exp.summary} ({len(jobs)} jobs, about {exp.expected_s():.0f} s)")
        for block in phases(jobs):
            if block[0].lane is None:
                self.run_lane(exp, block)
                continue
            lanes: dict[int, list[Job]] = {}
            for job in block:
                lanes.setdefault(int(job.lane), []).append(job)  # type: ignore[arg-type]
            threads = [
                threading.Thread(target=self.run_lane, args=(exp, q), daemon=True) for q in lanes.values()
            ]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(timeout=0.5)

    def run_lane(self, exp: Experiment, jobs: list[Job]) -> None:
        """One lane's jobs in order; an error of the runner itself fails that job's row, not the lane."""
        for job in jobs:
            try:
                self.run_job(exp, job)
            except Exception as err:  # noqa: BLE001 - recorded in the row, the other jobs go on
                argv, _ = self.command(exp, job)
                row = self.base_row(exp, job, argv)
                row.update(status="failed", note=f"runner error: {type(err).__name__}: {err}")
                self.add([row])
                self.say(f"{row['id']} failed in the runner: {type(err).__name__}: {err}")

    def prepare_extension(self, cache: Path | None, rebuild: bool, pack: bool) -> None:
        """The CUDA extension before the first GPU job: unpacked from ``cache`` or built (time-boxed)."""
        ext = Path(os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.cwd() / ".torch_extensions")))
        if rebuild:
            shutil.rmtree(ext, ignore_errors=True)
        elif cache is not None and cache.is_file() and not (ext.is_dir() and any(ext.iterdir())):
            with tarfile.open(cache) as tar:
                extract(tar, ext.parent)
            self.say(f"extension cache {cache} unpacked into {ext.parent}")
        setup = Experiment("setup", "the CUDA extension", (
            module("extension", "nerf_lightning.ops._ext", expected_s=5, timeout_s=300),
        ))  # fmt: skip
        (row,) = self.run_job(setup, setup.jobs[0])
        if row["status"] != "ok":
            self.say("the CUDA extension did not load: GPU jobs run on the PyTorch reference (slow)")
        if pack and ext.is_dir():
            with tarfile.open(self.out / "ext.tgz", "w:gz") as tar:
                tar.add(ext, arcname=ext.name)
            self.say(f"extension build packed into {self.out / 'ext.tgz'}")

    def archive(self, limit_bytes: int = 12 * 2**20) -> None:
        """``runs.tgz``: the small files of every run (metrics, curves, configs, the tail of each log)."""
        keep = {".json", ".jsonl", ".yaml", ".csv", ".txt", ".log", ".png"}
        total = 0
        with tarfile.open(self.out / "runs.tgz", "w:gz") as tar:
            for path in sorted(self.work.rglob("*")) if self.work.is_dir() else []:
                if not path.is_file() or path.suffix not in keep:
                    continue
                if path.suffix == ".png" and path.name != "curve.png":
                    continue
                data = path.read_bytes()[-256 * 2**10 :] if path.suffix == ".log" else path.read_bytes()
                if len(data) > 2 * 2**20 or total + len(data) > limit_bytes:
                    continue
                info = tarfile.TarInfo(str(path.relative_to(self.work)))
                info.size, info.mtime = len(data), int(path.stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))
                total += len(data)

    def finish(self) -> int:
        rows = sorted(with_baselines(self.rows), key=lambda r: r["seq"])
        atomic_write_bytes(
            self.out / "rows.jsonl", "".join(json.dumps(r, default=str) + "\n" for r in rows).encode()
        )
        table = format_table(rows)
        atomic_write_bytes(self.out / "table.txt", (table + "\n").encode())
        self.archive()
        print("\n" + table, flush=True)
        bad = [r["id"] for r in rows if r.get("status") != "ok"]
        print(f"\n{len(rows) - len(bad)} of {len(rows)} rows ok; results in {self.out}", flush=True)
        return 0 if rows and not bad else 1

    def stop(self) -> None:
        """Stop: no new job starts, the running ones are killed (their rows say so)."""
        self.stopping.set()
        with self.lock:
            running = list(self.children)
        for proc in running:
            kill_group(proc, grace_s=5.0)


def kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the process group of ``proc``, SIGKILL it after ``grace_s`` (Lightning traps SIGTERM)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def extract(tar: tarfile.TarFile, dest: Path) -> None:
    try:
        tar.extractall(dest, filter="data")
    except TypeError:  # Python without extraction filters
        tar.extractall(dest)  # noqa: S202 - our own cache


def with_baselines(rows: Iterable[Row]) -> list[Row]:
    """Each row with ``d_psnr`` (PSNR minus its baseline's) and ``ratio`` (its ``ratio_of`` over the
    baseline's; only between jobs that both ran alone), the baseline matched by part (``@15s`` to
    ``@15s``) or else its first row."""
    rows = [dict(r) for r in rows]
    by_part = {(r["experiment"], r["job"], r.get("part", "")): r for r in rows}
    first: dict[tuple[str, str], Row] = {}
    for r in rows:
        first.setdefault((r["experiment"], r["job"]), r)
    for r in rows:
        if not r.get("baseline") or r.get("status") != "ok":
            continue
        key = (r["experiment"], r["baseline"])
        b = by_part.get((*key, r.get("part", ""))) or first.get(key)
        if b is None or b.get("status") != "ok":
            continue
        r["baseline_id"] = b["id"]
        if r.get("psnr") is not None and b.get("psnr") is not None:
            r["d_psnr"] = r["psnr"] - b["psnr"]
        k = r.get("ratio_of", "steps_per_s")
        if r.get("ratio") is None and r["mode"] == b["mode"] == "alone" and r.get(k) and b.get(k):
            r["ratio"] = r[k] / b[k]
    return rows


def format_table(rows: Iterable[Row]) -> str:
    """The results as a text table (see :data:`COLUMNS`)."""
    rows = list(rows)
    cells = [[h for h, _, _ in COLUMNS]]
    for r in rows:
        line = []
        for _, key, fmt in COLUMNS:
            v = r.get(key)
            if key in _SPEED_KEYS and r.get("mode", "alone") != "alone" and key != "ratio":
                v = None  # a lane's speed depends on its neighbours
            line.append("-" if v is None or v == "" else fmt.format(v))
        cells.append(line)
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS) - 1)]
    out = ["  ".join(c[i].ljust(widths[i]) for i in range(len(widths))) + "  " + c[-1] for c in cells]
    out.insert(1, "-" * min(160, len(out[0])))
    if any(r.get("mode", "alone") != "alone" for r in rows):
        out.append("(lane jobs share the GPU: their speed is not shown here; rows.jsonl keeps it)")
    return "\n".join(out)


def list_experiments(experiments: dict[str, Experiment]) -> str:
    lines = [f"{'name':24s} {'jobs':>4s} {'~s':>6s}  {'GPUs':>4s}  {'data':14s} summary"]
    for exp in experiments.values():
        data = ",".join(exp.data) or "-"
        head = f"{exp.name:24s} {len(exp.jobs):4d} {exp.expected_s():6.0f}  {exp.gpus:4d}  {data:14s}"
        lines.append(f"{head} {exp.summary}")
    return "\n".join(lines)


def dry_run(suite: Suite, experiments: Sequence[Experiment]) -> None:
    for exp in experiments:
        missing = [d for d in exp.data if not (suite.data / d).exists()]
        print(f"== {exp.name}: {exp.summary} (about {exp.expected_s():.0f} s)")
        if missing:
            print(f"   (missing under {suite.data}: {', '.join(missing)}: these jobs would be skipped)")
        for job in suite.selected(exp):
            argv, env = suite.command(exp, job)
            mode = "alone" if job.lane is None else f"lane {job.lane}"
            extra = f", vs {job.baseline}" if job.baseline else ""
            print(f"-- {job.name} [{mode}, expects {job.expected_s:.0f} s, box {job.timeout_s:.0f} s{extra}]")
            prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
            print(f"   {prefix + ' ' if prefix else ''}{shlex.join(argv)}")


def default_data() -> Path:
    """``$NERF_LIGHTNING_DATA``, else ``.devdata`` (the GPU machine's carried copies) when it exists, else
    ``../shared/data``."""
    if os.environ.get("NERF_LIGHTNING_DATA"):
        return Path(os.environ["NERF_LIGHTNING_DATA"])
    return Path(".devdata") if Path(".devdata").is_dir() else Path("../shared/data")


def main(argv: list[str] | None = None) -> int:
    from benchmarks.experiments import EXPERIMENTS

    p = argparse.ArgumentParser(
        prog="python -m benchmarks.suite", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="experiments to run, in this order (--list)")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument("--dry-run", action="store_true", help="print every job's command line and exit")
    p.add_argument(
        "--out", type=Path, default=None, help="results folder (default outputs/bench/suite/<time>)"
    )
    p.add_argument("--work", type=Path, default=None, help="runs folder (default outputs/bench/runs)")
    p.add_argument(
        "--data", type=Path, default=None, help="folder with lego/ fox/ fruit/ (.devdata or ../shared/data)"
    )
    p.add_argument(
        "--limit",
        type=float,
        default=None,
        help="seconds for the whole run: jobs that would end later are skipped",
    )
    p.add_argument(
        "--only", default=None, metavar="GLOB", help="only the jobs whose name matches, e.g. '*_s1'"
    )
    p.add_argument(
        "--ext-cache", type=Path, default=Path(".devdata/ext.tgz"), help="a tar of the extension build"
    )
    p.add_argument("--rebuild-extension", action="store_true", help="build the CUDA extension from scratch")
    p.add_argument("--pack-extension", action="store_true", help="write the extension build to OUT/ext.tgz")
    args = p.parse_args(argv)
    if args.list or not args.names:
        print(list_experiments(EXPERIMENTS))
        return 0
    unknown = [n for n in args.names if n not in EXPERIMENTS]
    if unknown:
        print(
            f"error: unknown experiment(s) {', '.join(unknown)}; known: {', '.join(EXPERIMENTS)}",
            file=sys.stderr,
        )
        return 2
    experiments = [EXPERIMENTS[n] for n in args.names]
    out = args.out or Path("outputs/bench/suite") / time.strftime("%Y-%m-%d_%H-%M-%S")
    work = args.work or Path("outputs/bench/runs")
    data = (args.data or default_data()).resolve()
    suite = Suite(out, work.resolve(), data, args.limit, args.only, dry=args.dry_run)
    if args.dry_run:
        dry_run(suite, experiments)
        return 0
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    suite.gpus = visible_gpus()
    suite.say(
        f"{suite.gpus} GPU(s) visible; data {suite.data}; runs {suite.work}; limit {args.limit or 'none'}"
    )
    previous = {s: signal.signal(s, lambda *_: suite.stop()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if suite.gpus and any(j.gpus for e in experiments for j in suite.selected(e)):
            suite.sampler = GpuSampler()
            suite.sampler.start()
            suite.prepare_extension(args.ext_cache, args.rebuild_extension, args.pack_extension)
        for exp in experiments:
            suite.run_experiment(exp)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if suite.sampler is not None:
            suite.sampler.stop()
    return suite.finish()


if __name__ == "__main__":
    raise SystemExit(main())
