"""CPU execution of the native runtime beyond eager PyTorch: compiled decode steps."""
