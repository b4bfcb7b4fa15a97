"""CPU execution of the native runtime beyond eager PyTorch: a paged decode-attention kernel, compiled decode steps."""
