"""The radiance field of instant-ngp: hash encoding -> density MLP -> SH(direction) -> colour MLP.

Interface used by the renderer (``volume/renderer.py``)::

    field(positions [S, 3], directions [S, 3]) -> (sigmas [S], rgbs [S, 3])
    field.density(positions [S, 3]) -> sigmas [S]

Positions are in NGP space; they are normalized to [0, 1]^3 over the outer box
``[0.5 - aabb_scale/2, 0.5 + aabb_scale/2]^3`` before the encoding, so the finest hash level's
resolution (``max_resolution``) is given per unit cube and multiplied by ``aabb_scale`` here, as
instant-ngp does ("desired resolution 2048 over the unit cube").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

import torch
from torch import Tensor, nn

from nerf_lightning.config_keys import check_arguments
from nerf_lightning.config_schema import Formerly, Injected, KeysOf, Range
from nerf_lightning.models.encoding import HashEncoding, SHDegree, SHEncoding
from nerf_lightning.ops import Backend, as_backend
from nerf_lightning.ops.fused_mlp_support import fused_mlp_shapes_ok, has_mma_m16n8k16

__all__ = ["NGPField"]


def _mlp(n_in: int, n_hidden: int, n_layers: int, n_out: int) -> nn.Sequential:
    """ReLU MLP with ``n_layers`` hidden layers, no output activation (tcnn's FullyFusedMLP shape)."""
    layers: list[nn.Module] = []
    width = n_in
    for _ in range(n_layers):
        layers += [nn.Linear(width, n_hidden), nn.ReLU(inplace=True)]
        width = n_hidden
    layers.append(nn.Linear(width, n_out))
    return nn.Sequential(*layers)


def _weights_and_biases(mlp: nn.Sequential) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    linears = [m for m in mlp if isinstance(m, nn.Linear)]
    return [m.weight for m in linears], [m.bias for m in linears]


class NGPField(nn.Module):
    """instant-ngp NeRF field.

    Args:
        aabb_scale: side of the outer box in unit-cube units (power of two).
        encoding: keyword arguments of ``HashEncoding`` (n_levels, n_features_per_level,
            log2_hashmap_size, base_resolution, max_resolution); ``max_resolution`` is per unit
            cube: the box-wide finest resolution is ``max_resolution * aabb_scale``.
        hidden_dim: width of both MLPs (64 in instant-ngp).
        geo_feat_dim: density-MLP outputs passed to the colour MLP besides the density logit (15).
        density_hidden_layers / color_hidden_layers: 1 and 2 in instant-ngp.
        sh_degree: spherical-harmonics degree of the view encoding (4 -> 16 coefficients).
        density_bias: added to the density logit before ``trunc_exp`` (start mostly transparent).
        backend: the step's :class:`~nerf_lightning.ops.Backend` (``model.net.backend``, build_nerf passes
            it), or its name; the encodings get the same one. Its ops run the box normalisation and the
            density activation. The MLPs: under CUDA autocast to float16 / bfloat16
            (``precision=16-mixed`` / ``bf16-mixed``) both run as fused tensor-core kernels
            (``ops.fused_mlp``: half activations, fp32 accumulation and output, as tiny-cuda-nn's
            FullyFusedMLP) unless the backend is ``torch``; elsewhere as ``torch.nn`` layers (autocast's
            cuBLAS path under mixed precision). Precision ``32`` always runs the fp32 layers.
    """

    def __init__(
        self,
        aabb_scale: Annotated[int, Injected("NeRFModule: the capture's box")] = 1,
        encoding: Annotated[
            Mapping[str, Any] | None, KeysOf(HashEncoding), Formerly("model.encoding")
        ] = None,
        hidden_dim: Annotated[int, Range(low=1)] = 64,
        geo_feat_dim: Annotated[int, Range(low=0)] = 15,
        density_hidden_layers: Annotated[int, Range(low=0)] = 1,
        color_hidden_layers: Annotated[int, Range(low=0)] = 2,
        sh_degree: SHDegree = 4,
        density_bias: float = -1.0,
        backend: Annotated[Backend | str, Injected("build_nerf: model.net.backend")] = "auto",
    ) -> None:
        super().__init__()
        check_arguments(NGPField, locals())
        self.backend = as_backend(backend)
        self.aabb_scale = int(aabb_scale)
        lo, hi = 0.5 - aabb_scale / 2, 0.5 + aabb_scale / 2
        self.register_buffer("aabb_min", torch.full((3,), lo), persistent=False)
        self.register_buffer("aabb_size", torch.full((3,), hi - lo), persistent=False)
        self.encoding = HashEncoding(**dict(encoding or {}), aabb_scale=aabb_scale, backend=self.backend)
        self.geo_feat_dim = geo_feat_dim
        self.density_bias = density_bias
        self.density_mlp = _mlp(
            self.encoding.n_output_dims, hidden_dim, density_hidden_layers, 1 + geo_feat_dim
        )
        self.direction_encoding = SHEncoding(sh_degree, backend=self.backend)
        self.color_mlp = _mlp(
            1 + geo_feat_dim + self.direction_encoding.n_output_dims, hidden_dim, color_hidden_layers, 3
        )
        # networks of other shapes than the fused kernels' keep the torch layers under mixed precision
        self._fusable = all(
            fused_mlp_shapes_ok(mlp[0].in_features, *_weights_and_biases(mlp))
            for mlp in (self.density_mlp, self.color_mlp)
        )

    def mlp_parameters(self) -> list[nn.Parameter]:
        """Every parameter of both MLPs (weights and biases; not the encodings)."""
        return [*self.density_mlp.parameters(), *self.color_mlp.parameters()]

    def _normalize(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.backend.ops.normalize_to_box(positions, self.aabb_min, self.aabb_size)

    def _fused_dtype(self, x: Tensor) -> torch.dtype | None:
        """The half type of the fused MLP kernels for this call, or None for the ``torch.nn`` layers."""
        if not self.backend.fuses_mlp or not self._fusable or not x.is_cuda:
            return None
        if not torch.is_autocast_enabled("cuda") or not has_mma_m16n8k16(x.device):
            return None  # the kernels' m16n8k16 MMA needs Ampere or later
        dtype = torch.get_autocast_dtype("cuda")
        return dtype if dtype in (torch.float16, torch.bfloat16) else None

    def _run_mlp(self, mlp: nn.Sequential, x: Tensor, extra: Tensor | None = None) -> Tensor:
        """``mlp(cat(x, extra))``: fused half-precision kernels under CUDA autocast (float32 out)."""
        dtype = self._fused_dtype(x)
        if dtype is None:
            return mlp(x if extra is None else torch.cat([x, extra.to(x.dtype)], dim=-1))
        return self.backend.ops.fused_mlp(x, extra, *_weights_and_biases(mlp), dtype)

    def _geometry(self, positions: Tensor, features: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        x, inside = self._normalize(positions)
        encoded = self.encoding(x, features)
        h = self._run_mlp(self.density_mlp, encoded)
        sigma = self.backend.ops.density_activation(h, inside, self.density_bias)
        return sigma, h, encoded

    def density(self, positions: Tensor) -> Tensor:
        """Density sigma [S] (per NGP-space unit length) at positions [S, 3]."""
        return self._geometry(positions)[0]

    def density_and_features(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(sigma [S], the hash encoding's features [S, L * F]) at positions [S, 3]: the features go back
        into :meth:`forward` at the same positions, so a pass after this one skips the table's gather."""
        sigma, _, encoded = self._geometry(positions)
        return sigma, encoded

    def forward(
        self, positions: Tensor, directions: Tensor, features: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """(sigmas [S], rgbs [S, 3] in [0, 1]) at positions [S, 3] seen along unit directions [S, 3];
        ``features``: :meth:`density_and_features`' features at these positions (the same value; only the
        gradient is computed)."""
        sigma, h, _ = self._geometry(positions, features)
        sh = self.direction_encoding(directions)
        rgb = torch.sigmoid(self._run_mlp(self.color_mlp, h, sh).float())
        return sigma, rgb
