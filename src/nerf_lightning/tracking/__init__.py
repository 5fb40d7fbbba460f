"""Experiment tracking: loggers (CSV, TensorBoard, W&B), the multirun summary, Prometheus metrics."""
