# syntax=docker/dockerfile:1
# nerf_lightning training image: CUDA toolkit, PyTorch and this package, with our CUDA extension compiled
# ahead of time for sm_80 (A100), sm_86 (A10, RTX 30xx), sm_89 (L4, L40, RTX 40xx) and sm_90 (H100, H200):
# containers never compile at start.
#
#   docker build -t nerf-lightning:0.1.0 .
#   docker run --rm --gpus all --ipc=host -v /data:/data -v $PWD/outputs:/workspace/outputs \
#       nerf-lightning:0.1.0 python -m nerf_lightning.train data.path=/data/fox
#
# The toolkit stays in the image on purpose: the extension loader checks its cached build with nvcc and
# ninja at start (a few seconds, no compilation while TORCH_CUDA_ARCH_LIST and the sources are unchanged).
# Keep CUDA_IMAGE and TORCH_INDEX_URL on the same CUDA major version (here 13.0; cu128 + 12.8.x works too).
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ARG TORCH_CUDA_ARCH_LIST="8.0;8.6;8.9;9.0"

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:${PATH} \
    TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} \
    TORCH_EXTENSIONS_DIR=/opt/nerf_lightning/torch_extensions

# the distribution's Python (3.12 on Ubuntu 24.04); apt versions follow the pinned base image
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/*

RUN python3 -m venv "${VIRTUAL_ENV}" \
    && pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

WORKDIR /opt/nerf_lightning/src
COPY pyproject.toml README.md ./
COPY src ./src
# the package itself (a local path, not a registry name: pyproject.toml bounds its dependencies)
# hadolint ignore=DL3013
RUN pip install ".[cuda,slurm]"

# Ahead-of-time build for every architecture of TORCH_CUDA_ARCH_LIST (no GPU needed at build time). The
# cache stays writable for any user: the loader takes a lock file and records a stamp there.
RUN python -m nerf_lightning.ops._ext --no-check \
    && chmod -R a+rwX "${TORCH_EXTENSIONS_DIR}"

WORKDIR /workspace
CMD ["python", "-m", "nerf_lightning.train", "--help"]
