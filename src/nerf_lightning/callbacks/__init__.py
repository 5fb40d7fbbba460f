"""Lightning callbacks: throughput monitoring, ..."""
