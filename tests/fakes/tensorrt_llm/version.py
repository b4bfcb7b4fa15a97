"""Version the fake follows (the API is the 1.2 line's; see trtllm_api_snapshot.json)."""

__version__ = "1.2.0+fake"
