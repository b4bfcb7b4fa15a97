"""Benchmark scripts (not tests): the load generator (`python -m benchmarks.serve`), the gateway-overhead
benchmark (`python -m benchmarks.overhead`) and the benchmark-only SyntheticEngine.
Results are recorded in benchmarks/RESULTS.md."""
