"""The shipped models as package data: the embedded demo model (`python -m tools.demo_training.train`) and its draft,
LoRA adapters, and the default model's distilled draft (`python -m tools.demo_training.train_default_draft`)."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEMO_DIR = Path(__file__).resolve().parent
# the default model's draft: config.json and its decoder layers + final norm (matrices in int8 with a float32
# scale a row, "NAME.scale": half the bytes of bf16); the embedding is the target's
DEFAULT_DRAFT_DIR = DEMO_DIR / "smollm2_draft"
# the default model's EAGLE head (tools/demo_training/train_default_eagle.py), packed the same way
DEFAULT_EAGLE_DIR = DEMO_DIR / "smollm2_eagle"


def demo_model_path() -> str:
    """Folder of the embedded demo model (config.json, bf16 safetensors, tokenizer, chat template)."""
    return str(DEMO_DIR / "model")


def demo_draft_path() -> str:
    """Folder of the demo model's draft (same tokenizer, about 5x smaller), for speculative decoding."""
    return str(DEMO_DIR / "draft")


def default_draft_path(target: str) -> str:
    """The default model's draft as a full checkpoint folder, assembled once beside the target's converted
    folder `target`: the shipped layers with the target's embedding (tied head) and tokenizer files. Shipping
    the 28M-parameter embedding would make the package 5-10x larger for a copy of what the target holds."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    shipped = DEFAULT_DRAFT_DIR / "model.safetensors"
    digest = hashlib.sha256(shipped.read_bytes() + str(Path(target).resolve()).encode()).hexdigest()[:12]
    done = Path(target).parent / f"draft-{digest}"
    if done.is_dir():
        return str(done)
    # written into a temporary folder and renamed, so a crash or a concurrent start never sees half a folder
    work = Path(tempfile.mkdtemp(prefix=".draft-", dir=Path(target).parent))
    try:
        embed = "model.embed_tokens.weight"
        tensors = {}
        for file in sorted(Path(target).glob("*.safetensors")):
            with safe_open(str(file), "pt") as weights:
                if embed in weights.keys():
                    tensors[embed] = weights.get_tensor(embed)
        tensors.update(unpack_draft(load_file(shipped), tensors[embed].dtype))
        save_file(tensors, str(work / "model.safetensors"), metadata={"format": "pt"})
        shutil.copy(DEFAULT_DRAFT_DIR / "config.json", work / "config.json")
        for extra in Path(target).iterdir():
            if extra.suffix != ".safetensors" and extra.name not in ("config.json", "model.safetensors.index.json"):
                shutil.copy(extra, work / extra.name)
        try:
            work.rename(done)
        except OSError:  # another process assembled it first
            if not done.is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return str(done)


def pack_draft(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The shipped form of draft weights: each matrix as int8 rows with a float32 scale a row, vectors as bf16."""
    import torch

    out = {}
    for name, t in tensors.items():
        t = t.detach().float().cpu()
        if t.dim() == 2:
            scale = (t.abs().amax(dim=1, keepdim=True) / 127).clamp_min(1e-12)
            out[name], out[name + ".scale"] = (t / scale).round().clamp(-127, 127).to(torch.int8), scale
        else:
            out[name] = t.to(torch.bfloat16)
    return out


def unpack_draft(tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """pack_draft's weights back in `dtype` (int8 rows times their scales)."""
    import torch

    return {name: (t.float() * tensors[name + ".scale"] if t.dtype == torch.int8 else t.float()).to(dtype)
            for name, t in tensors.items() if not name.endswith(".scale")}
