#!/usr/bin/env bash
# Create .venv and install the project. On a machine without an NVIDIA GPU the CPU torch wheel
# (2.13.0) is installed first, so that resolving "torch>=2.4" never pulls a multi-GB CUDA build.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-dev}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check -q)
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo "[bootstrap] NVIDIA GPU found: installing torch with CUDA"
        "${PIP[@]}" "torch>=2.4"
    else
        echo "[bootstrap] no NVIDIA GPU: installing the CPU build torch==${TORCH_CPU_VERSION:-2.13.0}"
        "${PIP[@]}" "torch==${TORCH_CPU_VERSION:-2.13.0}"
    fi
fi
"${PIP[@]}" -e ".[${EXTRAS}]"
touch "$VENV/.installed"
echo "[bootstrap] ready: $VENV ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
