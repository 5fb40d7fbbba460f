"""Captures (formats), cameras and rays, image decoding and caching, synthetic scenes, samplers."""
