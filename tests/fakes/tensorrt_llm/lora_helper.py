"""LoraConfig (real: NVIDIA/TensorRT-LLM tensorrt_llm/lora_helper.py @ 585c756579dc4d01f21fc13c2f604cdb461ac4f0)."""

from __future__ import annotations

from typing import Dict, List, Literal, Optional

from pydantic import BaseModel, Field


class LoraConfig(BaseModel):
    """LoRA sizing and adapter folders. A plain pydantic BaseModel in the real file (not the
    extra="forbid" StrictBaseModel of llm_args.py), so unknown keys are ignored there too."""

    lora_dir: List[str] = Field(default_factory=list)
    lora_ckpt_source: Literal["hf", "nemo"] = "hf"
    max_lora_rank: int = 64
    lora_target_modules: List[str] = Field(default_factory=list)
    trtllm_modules_to_hf_modules: Dict[str, str] = Field(default_factory=dict)
    max_loras: Optional[int] = None
    max_cpu_loras: Optional[int] = None
    swap_gate_up_proj_lora_b_weight: bool = True
