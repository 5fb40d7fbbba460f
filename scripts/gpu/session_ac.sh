#!/usr/bin/env bash
# Prepared in the seventh session (2026-12-01); run in the eighth as call AC (BENCHMARKS.md).
# nvidia-h200, one GPU, alone: call AA's lego time points (session_aa.sh) again, after last.ckpt moved
# to a 60 s cadence (it was written every 1000 steps, ~96 times in call AA's 300 s run) and the step
# statistics were detached; bench.curve now also records a steps/s + GPU-utilization timeline per run.
# The 15 s run starts from about call AA's measured rate.
R=/tmp/rac RATE=330 exec bash scripts/gpu/session_aa.sh
