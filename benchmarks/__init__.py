"""The experiment runner and research tools: named experiments, A/B helpers, peers, step and batch-rule
analysis. Outside the package (not installed with the wheel); run from the repository root:
``python -m benchmarks.suite --list`` (``make bench-suite``)."""
