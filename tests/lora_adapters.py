"""Random PEFT LoRA adapters for tiny test models, and transformers + PEFT references.

    path = make_peft_adapter(base, tmp_path / "a", ["q_proj", "v_proj"], r=4, seed=1)
    ref = peft_greedy(base, path, prompt, 8)   # what our engine must produce with the adapter

PEFT initialises lora_B to zero (the adapter starts as a no-op); tests need adapters that change the
output, so every A and B is drawn from a seeded normal distribution.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

_REF: dict[tuple[str, str, tuple[int, ...], int], list[int]] = {}
_MODELS: dict[tuple[str, str], torch.nn.Module] = {}


def make_peft_adapter(base: Path, out: Path, targets: list[str], *, r: int = 4, alpha: float = 8.0,
                      seed: int = 0, std: float = 0.3, **config: Any) -> Path:
    """Save a PEFT LoRA adapter with random non-zero A and B for the checkpoint at `base` into `out`."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    fan_in_fan_out = model.config.model_type == "gpt2"  # GPT-2's Conv1D stores weights transposed
    cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                     fan_in_fan_out=fan_in_fan_out, **config)
    peft_model = get_peft_model(model, cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    peft_model.save_pretrained(out)
    return out


def peft_model(base: Path, adapter: Path) -> torch.nn.Module:
    """transformers + PEFT with the adapter applied (eos disabled, cached)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    key = (str(base), str(adapter))
    if key not in _MODELS:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
        model.generation_config.eos_token_id = None
        _MODELS[key] = PeftModel.from_pretrained(model, str(adapter)).eval()
    return _MODELS[key]


def peft_greedy(base: Path, adapter: Path, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation of `prompt` by transformers + PEFT (eos disabled)."""
    key = (str(base), str(adapter), tuple(prompt), max_new_tokens)
    if key not in _REF:
        model = peft_model(base, adapter)
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False)
        _REF[key] = out[0, len(prompt):].tolist()
    return _REF[key]


def trtllm_tensors(adapter: Path, scale: float, module_ids: dict[str, int]) -> tuple[list, list]:
    """A PEFT adapter in TensorRT-LLM's lora_weights / lora_config layout (Triton's lora_task_id inputs),
    written independently of runtime/native/lora/trtllm_format.py."""
    from safetensors.torch import load_file

    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    rows, config = [], []
    for key in sorted(k for k in tensors if k.endswith("lora_A.weight")):
        module = key.removesuffix(".lora_A.weight")
        a, b = tensors[key], tensors[module + ".lora_B.weight"] * scale
        layer = int(module.split(".layers.")[1].split(".")[0])
        config.append([module_ids[module.rsplit(".", 1)[1]], layer, a.shape[0]])
        rows.append(torch.cat([a.flatten(), b.flatten()]))
    width = max(len(r) for r in rows) + 3  # padded rows, as the format allows
    return [torch.nn.functional.pad(r, (0, width - len(r))).tolist() for r in rows], config
