"""tensorrt_llm.bindings: the C++ extension (here only stand-ins for the executor types the Python reads)."""
