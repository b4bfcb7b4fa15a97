"""Tensor parallelism: one process per rank, each layer's weights split across them (docs/tensor_parallel.md)."""
