"""Where the wall/kernel gap of a training step goes (lego, outside Lightning).

Prints, per precision: wall per step (host and GPU overlapped, as in training); the GPU's own span
per step with the host kept out of the way (a sleep kernel holds the GPU while the host enqueues
ten steps, then the GPU runs them back to back); the summed kernel time; kernels per step.
GPU span ~ wall: the gap is on the GPU (launch/ramp of many small kernels: fuse);
GPU span ~ kernels: the host cannot keep up (fewer launches / less Python per step).

    python3 scripts/gpu/census.py [32-true|bf16-mixed|16-mixed]   (repository root, .devdata/lego)
"""
import sys
import time
from collections import Counter

import hydra
import torch

from nerf_lightning.models.train_step import autocast_for, capture
from nerf_lightning.run.config import compose_train_config

torch.set_float32_matmul_precision("high")
prec = sys.argv[1] if len(sys.argv) > 1 else "32-true"
cfg = compose_train_config(["experiment=blender", "data.path=.devdata/lego", "logger=csv"], "/tmp/census")
dm = hydra.utils.instantiate(cfg.data)
dm.prepare_data()
dm.setup("fit")
model = hydra.utils.instantiate(cfg.model, aabb_scale=dm.aabb_scale).cuda()
dev = torch.device("cuda")
dm._ensure_device(dev)
step = model.train_step_fn
step.to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-15, betas=(0.9, 0.99), fused=True)
b = dm.train_batch(dm.batch_size)
# the batch graph's buffers are the step graph's inputs, as in training (no copies)
g = capture(step, (b["rays_o"], b["rays_d"], b["rgb"], b["background"]), prec, share_inputs=True)
# 16-mixed needs loss scaling, as Lightning's precision plugin does: without it the fp16 gradients
# underflow, the field empties, and the step measures less work (a 2026-11-30 census did)
scaler = torch.amp.GradScaler("cuda", enabled=prec == "16-mixed")


def one(i: int, update: bool = True) -> torch.Tensor:
    b = dm.train_batch(dm.batch_size)
    with autocast_for(prec):
        loss, _, _, stats = g(b["rays_o"], b["rays_d"], b["rgb"], b["background"])
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    if update and i % 16 == 0:
        model.occupancy.update(i + 300, model.field.density, warmup_steps=256)
    return stats


for i in range(400):
    one(i)
torch.cuda.synchronize()
n = 320
t = time.perf_counter()
for i in range(n):
    one(i)
torch.cuda.synchronize()
wall = (time.perf_counter() - t) / n * 1e3

spans, enq = [], []
for _rep in range(8):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time: the host enqueues 16 steps meanwhile
    start.record()
    t = time.perf_counter()
    for i in range(16):
        one(i, update=False)  # no occupancy update inside the timed span
    enq.append((time.perf_counter() - t) / 16 * 1e3)
    end.record()
    torch.cuda.synchronize()
    spans.append(start.elapsed_time(end) / 16)
gpu_span = sorted(spans)[len(spans) // 2]

acts = [torch.profiler.ProfilerActivity.CUDA]
with torch.profiler.profile(activities=acts) as prof:
    for i in range(1, 33):
        one(i, update=False)
    torch.cuda.synchronize()
count, kern = Counter(), Counter()
for e in prof.key_averages():
    if e.device_type == torch.autograd.DeviceType.CUDA and "#" not in e.key and e.self_device_time_total > 0:
        count[e.key[:70]] += e.count / 32
        kern[e.key[:70]] += e.self_device_time_total / 32 / 1e3
k_ms = sum(kern.values())
n_k = sum(count.values())
print(f"census {prec}: wall {wall:.3f} ms/step | GPU span (host out of the way) {gpu_span:.3f} | "
      f"host enqueue {sorted(enq)[len(enq)//2]:.3f} | kernels {k_ms:.3f} ms in {n_k:.0f} launches/step "
      f"| wall/kernels {wall / k_ms:.2f} span/kernels {gpu_span / k_ms:.2f}")
small = [(c, kern[k] / max(c, 1e-9) * 1e3, k) for k, c in count.items()]
print("  kernels < 5 us each:", f"{sum(c for c, us, _ in small if us < 5):.0f} per step,",
      f"{sum(kern[k] for c, us, k in small if us < 5):.3f} ms")
for c, us, k in sorted(small, reverse=True)[:30]:
    print(f"  {c:6.1f}x {us:7.1f} us  {k}")

# The GPU timeline of the profiled steps: where the time between kernels goes.
evs = sorted(
    (e.time_range.start, e.time_range.end, e.name[:50])
    for e in prof.events()
    if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
)
gaps = Counter()
hist = Counter()
total_gap = 0.0
for (s0, e0, n0), (s1, _e1, n1) in zip(evs, evs[1:], strict=False):
    g = max(0.0, s1 - max(e0, s0))
    total_gap += g
    hist["<1us" if g < 1 else "1-3us" if g < 3 else "3-6us" if g < 6 else "6-12us" if g < 12 else "12-50us" if g < 50 else ">50us"] += 1
    gaps[(n0, n1)] += g
span = (evs[-1][1] - evs[0][0]) / 32 / 1e3 if evs else 0.0
busy = sum(e - s for s, e, _ in evs) / 32 / 1e3
print(f"timeline: span {span:.3f} ms/step, busy {busy:.3f}, gaps {total_gap / 32 / 1e3:.3f} ms/step "
      f"over {len(evs) / 32:.0f} events/step; gap sizes: " + ", ".join(f"{k} {v / 32:.0f}" for k, v in sorted(hist.items())))
for (a, b), g in gaps.most_common(15):
    print(f"  gap {g / 32:7.1f} us/step  {a}  ->  {b}")
