"""The embedded demo model: a small Llama trained by `python -m runtime.demo.train`, shipped as package data."""

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent


def demo_model_path() -> str:
    """Folder of the embedded demo model (config.json, bf16 safetensors, tokenizer, chat template)."""
    return str(DEMO_DIR / "model")


def demo_draft_path() -> str:
    """Folder of the demo model's draft (same tokenizer, about 5x smaller), for speculative decoding."""
    return str(DEMO_DIR / "draft")
