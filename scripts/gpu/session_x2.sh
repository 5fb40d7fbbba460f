#!/usr/bin/env bash
# shellcheck disable=SC2086  # override lists ($LEGO, $OUT paths) are split into words on purpose
# x2 session: CUDA tests, DDP scaling 1->2 GPUs, time to PSNR, precision under DDP, FSDP (memory + e2e),
# torchrun vs Lightning's launcher. Every part time-boxed; table last.
set -u
export TORCH_EXTENSIONS_DIR=$PWD/.torch_extensions WANDB_MODE=offline PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s); el() { echo "[t=$(( $(date +%s) - T0 ))s] $*"; }
nvidia-smi -L
if [ -f .devdata/ext.tgz ]; then tar xzf .devdata/ext.tgz && find .torch_extensions -type f -exec touch {} +; fi
timeout 200 python3 -m nerf_lightning.ops._ext 2>&1 | tail -1; tar czf $OUT/ext.tgz .torch_extensions; el build
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -q -m cuda tests -p no:cacheprovider 2>&1 | tail -4; el tests
LEGO="experiment=blender data.path=.devdata/lego logger=csv callbacks.progress_bar=null callbacks.model_checkpoint=null trainer.check_val_every_n_epoch=100000"
R=/tmp/r; mkdir -p $R
summary() {
python3 - <<'PY'
import json, glob, os
rows = []
for d in sorted(glob.glob("/tmp/r/*/metrics.json")):
    m = json.load(open(d)); n = d.split("/")[-2]
    rows.append((n, m.get("steps"), m.get("time/train_s"), m.get("val/psnr"), m.get("train/rays_per_s"), m.get("train/samples_per_s"), m.get("gpu/mem_peak_gb"), m.get("gpu/utilization_mean"), m.get("perf/forward_imbalance")))
json.dump(rows, open(os.environ["OUT"] + "/x2.json", "w"), indent=1)
print(f"{'run':16s} {'steps':>6s} {'train_s':>8s} {'psnr':>6s} {'Mrays/s':>8s} {'Msmp/s':>7s} {'memGB':>6s} {'gpu%':>5s} {'imb':>5s}")
for r in rows:
    f = lambda v, fmt: (fmt % v) if isinstance(v, (int, float)) else "-"
    print(f"{r[0]:16s} {f(r[1],'%6d')} {f(r[2],'%8.2f')} {f(r[3],'%6.2f')} {f(r[4] and r[4]/1e6,'%8.2f')} {f(r[5] and r[5]/1e6,'%7.1f')} {f(r[6],'%6.2f')} {f(r[7],'%5.0f')} {f(r[8],'%5.2f')}")
PY
}
run() { name=$1; shift; timeout ${TO:-90} python3 -m nerf_lightning.train $LEGO "$@" hydra.run.dir=$R/$name > $R/$name.log 2>&1 || { echo "FAIL $name"; grep -iE "error|exception" $R/$name.log | tail -4; }; el $name; summary > /tmp/summary.txt 2>&1; }
CUDA_VISIBLE_DEVICES=0 run g1_3000 trainer.max_steps=3000
run g2_3000 strategy=ddp devices=2 trainer.max_steps=3000
run g2_1500 strategy=ddp devices=2 trainer.max_steps=1500
run g2_bf16 strategy=ddp devices=2 trainer.max_steps=3000 precision=bf16-mixed
run g2_fp16 strategy=ddp devices=2 trainer.max_steps=3000 precision=16-mixed
TO=120 run fsdp2_1000 strategy=fsdp devices=2 trainer.max_steps=1000
# shellcheck disable=SC2043  # one size in this session (22 did not fit the time)
for t in 24; do
  CUDA_VISIBLE_DEVICES=0 TO=60 run mem_single_$t trainer.max_steps=200 model.field.encoding.log2_hashmap_size=$t
  TO=70 run mem_ddp2_$t strategy=ddp devices=2 trainer.max_steps=200 model.field.encoding.log2_hashmap_size=$t
  TO=90 run mem_fsdp2_$t strategy=fsdp devices=2 trainer.max_steps=200 model.field.encoding.log2_hashmap_size=$t
done
timeout 80 python3 -m torch.distributed.run --standalone --nproc-per-node=2 -m nerf_lightning.train $LEGO strategy=ddp devices=2 trainer.max_steps=3000 hydra.run.dir=$R/torchrun_3000 > $R/torchrun_3000.log 2>&1 || echo FAIL torchrun; el torchrun
summary
