"""nerf_lightning: instant-ngp-class NeRF training with PyTorch Lightning + Hydra."""

__version__ = "0.1.0"
