"""Which tiny-cuda-nn call works on this GPU: each case in a fresh interpreter, so that a crash of one
(a segmentation fault in the native module) is reported as its exit status and the others still run.

    python scripts/tcnn/smoke.py        # needs tinycudann importable and a CUDA GPU

Cases: the import; tcnn's own ``Encoding`` (HashGrid, 16 and 8 levels, fp32 and fp16 tables, inference and
training); our backend (``HashEncoding(backend="tcnn")``). One line a case: its name, its exit status and
the last lines it printed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

SETUP = textwrap.dedent(
    """
    import faulthandler; faulthandler.enable()
    import torch
    import tinycudann as tcnn
    x = torch.rand(1 << 16, 3, device="cuda")
    def encoding(dtype, **kw):
        cfg = {"otype": "HashGrid", "n_levels": 16, "n_features_per_level": 2, "log2_hashmap_size": 19,
               "base_resolution": 16, "per_level_scale": 1.3819, "interpolation": "Linear", **kw}
        return tcnn.Encoding(n_input_dims=3, encoding_config=cfg, dtype=dtype).cuda()
    """
)
CASES = {
    "import": "import tinycudann as t; m = t.modules._C\n"
    "print('networks', m.has_networks(), 'granularity', m.batch_size_granularity())",
    "fp32 inference": SETUP + "with torch.no_grad(): y = encoding(torch.float32)(x)\n"
    "torch.cuda.synchronize(); print(tuple(y.shape), y.dtype)",
    "fp16 inference": SETUP + "with torch.no_grad(): y = encoding(torch.float16)(x)\n"
    "torch.cuda.synchronize(); print(tuple(y.shape), y.dtype)",
    "fp32 training": SETUP + "e = encoding(torch.float32); e(x).float().sum().backward()\n"
    "torch.cuda.synchronize(); print(float(e.params.grad.abs().sum()))",
    "fp16 training": SETUP + "e = encoding(torch.float16); e(x).float().sum().backward()\n"
    "torch.cuda.synchronize(); print(float(e.params.grad.abs().sum()))",
    "8 levels, fp32": SETUP + "e = encoding(torch.float32, n_levels=8, per_level_scale=2.0)\n"
    "with torch.no_grad(): y = e(x)\n"
    "torch.cuda.synchronize(); print(tuple(y.shape))",
    "ours, backend=tcnn": SETUP + "from nerf_lightning.models.encoding import HashEncoding\n"
    "h = HashEncoding(backend='tcnn').cuda()\nwith torch.no_grad(): y = h(x)\n"
    "torch.cuda.synchronize(); print(tuple(y.shape))",
}


def main() -> int:
    failed = 0
    for name, code in CASES.items():
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        failed += proc.returncode != 0
        print(f"{name:20s} rc={proc.returncode:4d} | " + " / ".join(lines[-2:])[:300])
        if proc.returncode < 0:  # killed by a signal: where, from faulthandler's first lines
            print("    " + " / ".join(proc.stderr.splitlines()[:5])[:500])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
