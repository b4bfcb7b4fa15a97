"""What the two adapter-training scripts share: their LoRA options, the learning-rate schedule and how an
adapter is saved as package data (bf16 weights, no PEFT model card)."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def add_lora_options(parser: argparse.ArgumentParser, *, steps: int, lr: float) -> None:
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16.0)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)


def lr_scale(step: int, steps: int) -> float:
    """Linear warm-up over 10 % of the steps, then cosine decay to zero."""
    warm = max(1, steps // 10)
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def save_adapter(peft_model: torch.nn.Module, out: Path) -> Path:
    """Save `peft_model`'s adapter into `out` with bf16 weights; returns the weights file."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out))  # type: ignore[operator]
    weights_file = out / "adapter_model.safetensors"
    tensors = load_file(str(weights_file))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(weights_file))
    weights_file.chmod(0o644)  # package data: readable by every user
    (out / "README.md").unlink(missing_ok=True)  # PEFT's model-card template; ADAPTER.md says what this is
    return weights_file


def write_report(out: Path, intro: list[str], measured: str, losses: tuple[float, float], samples_title: str,
                 samples: list[tuple[str, str, str]], serve_flags: str, name: str) -> None:
    """ADAPTER.md in `out`: `intro`, the held-out loss of base vs base + adapter, greedy samples (prompt as
    shown, base output, adapter output) and how to serve it."""
    base_loss, lora_loss = losses
    lines = [*intro, "", f"| {measured} | loss (nats/token) | perplexity |", "|---|---|---|",
             f"| base model | {base_loss:.3f} | {math.exp(base_loss):.1f} |",
             f"| base + this adapter | {lora_loss:.3f} | {math.exp(lora_loss):.1f} |", "", samples_title, ""]
    for prompt, plain, adapted in samples:
        lines += [f"- {prompt}", f"  - base: `{plain!r}`", f"  - adapter: `{adapted!r}`"]
    lines += ["", f"Serve it: `trtllm-gateway serve {serve_flags}`, then send `\"model\": \"{name}\"`.", ""]
    (out / "ADAPTER.md").write_text("\n".join(lines), encoding="utf-8")
