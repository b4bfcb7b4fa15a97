"""Protocol dialects (OpenAI, Triton): pure translation between wire schemas and runtime types, no I/O."""
