"""HTTP side of trtllm-gateway: Starlette app, routes, SSE, errors, metrics, settings, CLI."""
