"""Benchmark of the CUDA ops against the PyTorch reference, measured in the same run.

    python -m nerf_lightning.bench.ops [--quick] [--json PATH] [--no-step] [--profile]

Needs an NVIDIA GPU (the extension is built on first use). Measures, CUDA vs reference:

- hash encoding forward+backward (instant-ngp config: L=16, F=2, T=2^19, 16..2048) at 2^18 and 2^20
  points, fp32 table (and fp16 for CUDA), points/s and the achieved bytes/s of the minimum traffic
  (x, output, 8 corner reads per level; gradient: grad_out and 8 corner read-modify-writes) against
  the measured device-to-device copy bandwidth;
- ray marching (ray-box + march_rays) rays/s on a 128^3 occupancy grid with a shell-shaped object;
- compositing (volume_render) samples/s forward+backward on those samples;
- one full training step of the default field (hash grid + MLPs + SH, march, render, Huber loss,
  backward, Adam) with the reference path (torch encoding + torch ops) vs the CUDA path.

Times are medians of CUDA-event timings after warm-up. The table is printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

DEV = torch.device("cuda")


def timeit(fn: Callable[[], Any], warmup: int = 3, iters: int = 10, max_s: float = 10.0) -> float:
    """Median seconds per call: CUDA events around each invocation on a GPU, the wall clock without one (dry
    runs); at least 3 calls, fewer than ``iters`` once ``max_s`` has passed."""
    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    t_start = time.perf_counter()
    for _ in range(iters):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        if time.perf_counter() - t_start > max_s and len(times) >= 3:
            break
    return statistics.median(times)


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (2 GiB buffers)."""
    n = 1 << 29
    src = torch.randn(n, device=DEV)
    dst = torch.empty_like(src)
    t = timeit(lambda: dst.copy_(src), warmup=3, iters=10)
    return 2 * n * 4 / t


# ------------------------------------------------------------------------------ scene helpers
def shell_binaries(c: int, g: int) -> torch.Tensor:
    """A hollow sphere (radius 0.2..0.35 around the unit cube's centre) in cascade 0, empty elsewhere."""
    ax = (torch.arange(g, device=DEV) + 0.5) / g - 0.5
    r = torch.sqrt(ax[:, None, None] ** 2 + ax[None, :, None] ** 2 + ax[None, None, :] ** 2)
    bins = torch.zeros(c, g, g, g, dtype=torch.bool, device=DEV)
    bins[0] = (r > 0.2) & (r < 0.35)
    return bins


def camera_rays(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Rays from a sphere of radius 1.5 around (0.5, 0.5, 0.5) through points near the centre."""
    o = torch.nn.functional.normalize(torch.randn(n, 3, device=DEV, generator=gen), dim=-1) * 1.5 + 0.5
    target = 0.5 + (torch.rand(n, 3, device=DEV, generator=gen) - 0.5) * 0.8
    d = torch.nn.functional.normalize(target - o, dim=-1)
    return o.contiguous(), d.contiguous()


# ------------------------------------------------------------------------------ benchmarks
def bench_hash(results: list[dict], quick: bool, copy_bw: float) -> None:
    from nerf_lightning.models.encoding import HashEncoding
    from nerf_lightning.ops import cuda as cu
    from nerf_lightning.ops.reference import hash_encode as hash_encode_reference

    enc = HashEncoding(backend="cuda").to(DEV)
    L, F = enc.n_levels, enc.n_features_per_level
    rows = enc.offsets[-1]
    for log2n in (18, 20):
        n = 1 << log2n
        x = torch.rand(n, 3, device=DEV)
        g = torch.randn(n, L * F, device=DEV)
        row: dict[str, Any] = {"name": f"hash enc fwd+bwd 2^{log2n} pts", "unit": "pts/s"}
        for label, dtype in (("cuda", torch.float32), ("cuda_fp16", torch.float16)):
            p = enc.params.detach().to(dtype).requires_grad_(True)

            def step(p: torch.Tensor = p, x: torch.Tensor = x, g: torch.Tensor = g) -> None:
                p.grad = None
                out = cu.hash_encode(x, p, enc.scales, enc.resolutions, enc.offsets)
                out.backward(g)

            row[label] = n / timeit(step, warmup=5, iters=30)
            if label == "cuda":
                os.environ["NERF_LIGHTNING_HASH_ORDER"] = "level"
                row["cuda_level_major"] = n / timeit(step, warmup=5, iters=30)
                os.environ.pop("NERF_LIGHTNING_HASH_ORDER")
                with torch.no_grad():
                    row["cuda_fwd_only"] = n / timeit(
                        lambda p=p, x=x: cu.hash_encode(x, p, enc.scales, enc.resolutions, enc.offsets),
                        warmup=5,
                        iters=30,
                    )
        # minimum traffic per point: x 12 B + out L*F*4; bwd: grad_out L*F*4, x 12 B, 8 corner RMW
        bytes_pt = 12 + 4 * L * F + 8 * L * F * 4 + 12 + 4 * L * F + 8 * L * F * 4 * 2
        table_bytes = rows * F * 4  # zeroing the fp32 gradient table
        t_cuda = n / row["cuda"]
        row["bytes_per_s_cuda"] = (n * bytes_pt + table_bytes) / t_cuda
        row["frac_copy_bw"] = row["bytes_per_s_cuda"] / copy_bw
        pr = enc.params.detach().clone().requires_grad_(True)

        def ref_step(pr: torch.Tensor = pr, x: torch.Tensor = x, g: torch.Tensor = g) -> None:
            pr.grad = None
            out = hash_encode_reference(x, pr, enc.scales, enc.resolutions, enc.offsets)
            out.backward(g)

        row["reference"] = n / timeit(ref_step, warmup=1, iters=3 if quick else 5)
        # The torch backend of HashEncoding (a fused gather/index_add path when one exists).
        enc_t = HashEncoding(backend="torch").to(DEV)

        def torch_backend_step(enc_t: HashEncoding = enc_t, x: torch.Tensor = x, g: torch.Tensor = g) -> None:
            enc_t.params.grad = None
            enc_t(x).backward(g)

        row["torch_backend"] = n / timeit(torch_backend_step, warmup=1, iters=3 if quick else 5)
        results.append(row)


def bench_rays(results: list[dict], quick: bool) -> dict[str, Any]:
    from nerf_lightning.ops import cuda as cu
    from nerf_lightning.ops import reference as ref

    gen = torch.Generator(device=DEV).manual_seed(0)
    n_rays = 1 << 16
    o, d = camera_rays(n_rays, gen)
    bins = shell_binaries(1, 128)
    box = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0], device=DEV)
    jit = torch.rand(n_rays, device=DEV, generator=gen)

    def march(mod: Any) -> Any:
        tn, tf, _ = mod.ray_aabb_intersect(o, d, box)
        return mod.march_rays(o, d, tn, tf, bins, t_jitter=jit)

    packed = march(cu)
    n_samples = packed.t_starts.shape[0]
    row = {"name": f"march 2^16 rays ({n_samples / n_rays:.0f} smp/ray)", "unit": "rays/s"}
    row["cuda"] = n_rays / timeit(lambda: march(cu), warmup=3, iters=20)
    row["reference"] = n_rays / timeit(lambda: march(ref), warmup=1, iters=3 if quick else 5)
    results.append(row)

    s = n_samples
    sig = (torch.rand(s, device=DEV, generator=gen) ** 2 * 100).requires_grad_(True)
    rgb = torch.rand(s, 3, device=DEV, generator=gen).requires_grad_(True)
    bg = torch.rand(3, device=DEV)
    ri, ts, te, info = packed

    def render(mod: Any) -> None:
        sig.grad = None
        rgb.grad = None
        out = mod.volume_render(sig, rgb, ts, te, ri, n_rays, info, background=bg)
        (out["rgb"].sum() + out["depth"].sum() + out["opacity"].sum()).backward()

    row = {"name": f"render fwd+bwd {s / 1e6:.2f}M smp", "unit": "smp/s"}
    row["cuda"] = s / timeit(lambda: render(cu), warmup=3, iters=20)
    row["reference"] = s / timeit(lambda: render(ref), warmup=1, iters=5 if quick else 10)
    results.append(row)
    return {"samples_per_ray": n_samples / n_rays}


def make_step(
    ops_backend: str, enc_backend: str, n_rays: int, autocast: torch.dtype | None = None
) -> tuple[Callable[[], None], Any]:
    from nerf_lightning.models.field import NGPField
    from nerf_lightning.ops import Backend
    from nerf_lightning.volume.occupancy import OccupancyGrid
    from nerf_lightning.volume.renderer import Renderer

    torch.manual_seed(0)
    field = NGPField(aabb_scale=1).to(DEV)
    field.encoding.backend = Backend(enc_backend)  # the hash grid alone, against the renderer's ops
    grid = OccupancyGrid(aabb_scale=1, resolution=128).to(DEV)
    grid.binaries.copy_(shell_binaries(1, 128))
    renderer = Renderer(grid, backend=ops_backend).to(DEV)
    opt = torch.optim.Adam(field.parameters(), lr=1e-2, betas=(0.9, 0.99), eps=1e-15)
    gen = torch.Generator(device=DEV).manual_seed(1)
    o, d = camera_rays(n_rays, gen)
    target = torch.rand(n_rays, 3, device=DEV, generator=gen)
    bg = torch.rand(n_rays, 3, device=DEV, generator=gen)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        ctx = torch.autocast("cuda", dtype=autocast) if autocast is not None else contextlib.nullcontext()
        with ctx:
            out = renderer.render_rays(field, o, d, bg, jitter=True)
            loss = torch.nn.functional.huber_loss(out.rgb.float(), target, delta=0.1)
        loss.backward()
        opt.step()

    return step, (field, renderer)


def bench_step(results: list[dict], quick: bool, profile: bool) -> str | None:
    cuda_fp32 = None
    first: dict[str, Any] = {}
    for log2r, prec, ac in ((13, "32/tf32", None), (13, "bf16-mixed", torch.bfloat16), (15, "32/tf32", None)):
        if quick and log2r != 13:
            continue
        n_rays = 1 << log2r
        row: dict[str, Any] = {"name": f"train step 2^{log2r} rays {prec}", "unit": "steps/s"}
        cuda_step, _ = make_step("cuda", "cuda", n_rays, ac)
        row["cuda"] = 1.0 / timeit(cuda_step, warmup=5, iters=30)
        ref_step, _ = make_step("torch", "torch", n_rays, ac)
        row["reference"] = 1.0 / timeit(ref_step, warmup=2, iters=3 if quick else 6)
        results.append(row)
        if cuda_fp32 is None:
            cuda_fp32, first = cuda_step, row
    if not profile or cuda_fp32 is None:
        return None
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            cuda_fp32()
        torch.cuda.synchronize()
    events = prof.key_averages()
    busy_us = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in events)
    table = events.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=60)
    first["gpu_busy_ms"] = busy_us / 1e3 / 5
    return (
        f"{table}\nGPU busy {first['gpu_busy_ms']:.2f} ms per CUDA-path step ({first['name']}); "
        f"step time {1e3 / first['cuda']:.2f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer reference iterations")
    ap.add_argument("--json", default=None, help="write the results as JSON here")
    ap.add_argument("--no-step", action="store_true", help="skip the full training step")
    ap.add_argument("--profile", action="store_true", help="torch.profiler top kernels of the CUDA step")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.ops needs an NVIDIA GPU", file=sys.stderr)
        return 2
    from nerf_lightning.ops import _ext
    from nerf_lightning.ops import cuda as cu

    t0 = time.perf_counter()
    if not cu.is_available():
        print(f"CUDA extension unavailable: {_ext.error()}", file=sys.stderr)
        return 1
    print(f"extension ready in {time.perf_counter() - t0:.1f} s", flush=True)
    # As nerf_lightning.train does: TF32 matmuls for float32 (the "32" precision preset).
    torch.set_float32_matmul_precision("high")
    results: list[dict] = []
    copy_bw = copy_bandwidth()
    bench_hash(results, args.quick, copy_bw)
    info = bench_rays(results, args.quick)
    prof = None
    if not args.no_step:
        prof = bench_step(results, args.quick, args.profile)
    if prof:
        print(prof)
    meta = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copy_bw_TBps": copy_bw / 1e12,
        **info,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)
    print(f"\n{meta['gpu']}, torch {meta['torch']}, copy bandwidth {copy_bw / 1e12:.2f} TB/s (read+write)")
    print(f"{'benchmark':40s} {'unit':8s} {'reference':>12s} {'cuda':>12s} {'speedup':>8s}  notes")
    for r in results:
        notes = ""
        if "cuda_fp16" in r:
            notes = (
                f"fp16 table {r['cuda_fp16']:.3g}/s; {r['bytes_per_s_cuda'] / 1e12:.2f} TB/s min-traffic "
                f"= {100 * r['frac_copy_bw']:.0f}% of copy; torch backend {r['torch_backend']:.3g}/s "
                f"({r['cuda'] / r['torch_backend']:.1f}x); fwd only {r['cuda_fwd_only']:.3g}/s; "
                f"level-major threads {r['cuda_level_major']:.3g}/s"
            )
        print(
            f"{r['name']:40s} {r['unit']:8s} {r['reference']:12.4g} {r['cuda']:12.4g} "
            f"{r['cuda'] / r['reference']:7.1f}x  {notes}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
