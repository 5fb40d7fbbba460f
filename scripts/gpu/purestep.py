"""Step time outside Lightning: datamodule batch + graphed budget step + fused Adam (lego)."""
import sys, time, torch
from nerf_lightning.run.config import compose_train_config
import hydra
torch.set_float32_matmul_precision("high")
prec = sys.argv[1] if len(sys.argv) > 1 else "32-true"
cfg = compose_train_config(["experiment=blender", "data.path=.devdata/lego", "logger=csv"], "/tmp/ps")
dm = hydra.utils.instantiate(cfg.data); dm.prepare_data(); dm.setup("fit")
model = hydra.utils.instantiate(cfg.model, aabb_scale=dm.aabb_scale).cuda()
dev = torch.device("cuda"); dm._ensure_device(dev)
step = model.train_step_fn; step.to(dev)
opt = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-15, betas=(0.9, 0.99), fused=True)
from nerf_lightning.models.train_step import capture, autocast_for
b = dm.train_batch(dm.batch_size)
args = (b["rays_o"], b["rays_d"], b["rgb"], b["background"])
g = capture(step, args, prec) if "--eager" not in sys.argv else step
def one(i):
    b = dm.train_batch(dm.batch_size)
    with autocast_for(prec):
        loss, per_ray, valid, stats = g(b["rays_o"], b["rays_d"], b["rgb"], b["background"])
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    if i % 16 == 0:
        model.occupancy.update(i + 300, model.field.density, warmup_steps=256)
    return stats
for i in range(300): one(i)
torch.cuda.synchronize(); t = time.perf_counter(); n = 300
for i in range(n): st = one(i)
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / n
# GPU time alone: time the data + graph part under events
acts=[torch.profiler.ProfilerActivity.CUDA]
with torch.profiler.profile(activities=acts) as prof:
    for i in range(50): one(i)
    torch.cuda.synchronize()
k = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA and "#" not in e.key) / 50 / 1e3
print(f"purestep {prec} {'eager' if '--eager' in sys.argv else 'graph'}: wall {dt*1e3:.3f} ms/step, kernels {k:.3f} ms/step, rays/step {float(st[0]):.0f}, rendered {float(st[2]):.0f}, marched {float(st[1]):.0f}")
