"""LoraTargets: which Linear modules of a model an adapter may update, and how sources name them.

Two naming schemes reach us: PEFT module paths ("base_model.model.model.layers.3.self_attn.q_proj") and
TensorRT-LLM module ids per layer (attn_q = 1, ...). Both resolve to (our module name, output rows):
q/k/v and gate/up are fused in our Linears, so a PEFT q_proj pair updates only the q rows of qkv_proj.
Only Linears inside decoder layers are targets (never lm_head).
"""

from __future__ import annotations

import re

from runtime.errors import InvalidRequestError
from runtime.native.models import CausalLM
from runtime.native.models.linear import Linear

_LAYER = re.compile(r"^(?P<prefix>.*?\.)(?P<index>\d+)\.(?P<local>.+)$")
_PEFT_PREFIX = "base_model.model."

# TensorRT-LLM module id -> (module path inside a decoder layer, fused part or None for the whole Linear).
# Ids and the HF equivalents follow TensorRT-LLM (docs/source/advanced/lora.md and
# lora_helper.get_default_trtllm_modules_to_hf_modules: mlp_h_to_4h is gate_proj, mlp_gate is up_proj).
TRTLLM_MODULE_IDS = {
    "attn_qkv": 0, "attn_q": 1, "attn_k": 2, "attn_v": 3, "attn_dense": 4,
    "mlp_h_to_4h": 5, "mlp_4h_to_h": 6, "mlp_gate": 7, "mlp_gate_up": 18,
}
_LLAMA_TRTLLM = {
    0: ("self_attn.qkv_proj", None), 1: ("self_attn.qkv_proj", "q_proj"), 2: ("self_attn.qkv_proj", "k_proj"),
    3: ("self_attn.qkv_proj", "v_proj"), 4: ("self_attn.o_proj", None), 5: ("mlp.gate_up_proj", "gate_proj"),
    6: ("mlp.down_proj", None), 7: ("mlp.gate_up_proj", "up_proj"), 18: ("mlp.gate_up_proj", None),
}
_GPT2_TRTLLM = {0: ("attn.c_attn", None), 4: ("attn.c_proj", None), 5: ("mlp.c_fc", None), 6: ("mlp.c_proj", None)}


class LoraTargets:
    """The model's adaptable Linears by module name, with name resolution for both adapter formats."""

    def __init__(self, model: CausalLM) -> None:
        self.model = model
        self.modules: dict[str, Linear] = {}
        self.layer_of: dict[str, int] = {}
        prefixes, locals_ = set(), set()
        for name, module in model.named_modules():
            m = _LAYER.match(name)
            if isinstance(module, Linear) and m is not None:
                self.modules[name] = module
                self.layer_of[name] = int(m["index"])
                prefixes.add(m["prefix"])
                locals_.add(m["local"])
        self.layer_prefix = prefixes.pop() if len(prefixes) == 1 else ""
        self.num_layers = model.spec.num_layers
        self._trtllm = (_LLAMA_TRTLLM if "self_attn.qkv_proj" in locals_
                        else _GPT2_TRTLLM if "attn.c_attn" in locals_ else {})

    def rows(self, module: str, part: str | None) -> tuple[int, int]:
        """(start, size) of the output rows `part` covers (the whole Linear for None), in the checkpoint's projection
        (the whole of it under tensor parallelism too: adapters are read whole, then split: DeviceSlots.place)."""
        return self.modules[module].full_part_range(part)

    def resolve_peft(self, peft_module: str) -> tuple[str, int, int]:
        """(our module, row start, row count) for a PEFT module path; InvalidRequestError if not adaptable."""
        name = peft_module.removeprefix(_PEFT_PREFIX)
        target = self.model.checkpoint_target(name + ".weight")
        module = target[0].removesuffix(".weight") if target else ""
        if module not in self.modules:
            raise InvalidRequestError(
                f"the adapter targets '{name}', which is not an adaptable projection of this model "
                f"(adaptable: {self.describe()})", param="adapter")
        start, size = self.rows(module, target[1])  # type: ignore[index]
        return module, start, size

    def resolve_trtllm(self, module_id: int, layer: int) -> tuple[str, int, int]:
        """(our module, row start, row count) for a TensorRT-LLM module id and layer index."""
        if module_id not in self._trtllm:
            names = {v: k for k, v in TRTLLM_MODULE_IDS.items()}
            known = ", ".join(f"{i} ({names[i]})" for i in sorted(self._trtllm))
            raise InvalidRequestError(
                f"lora_config: module id {module_id} is not supported for this model (supported: {known})",
                param="lora_config")
        if not 0 <= layer < self.num_layers:
            raise InvalidRequestError(
                f"lora_config: layer index {layer} is out of range (the model has {self.num_layers} layers)",
                param="lora_config")
        local, part = self._trtllm[module_id]
        module = f"{self.layer_prefix}{layer}.{local}"
        if module not in self.modules:  # e.g. an MLP id on a mixture-of-experts layer (its experts are not adaptable)
            raise InvalidRequestError(f"lora_config: module id {module_id} has no projection in layer {layer} of this "
                                      f"model (adaptable: {self.describe()})", param="lora_config")
        start, size = self.rows(module, part)
        return module, start, size

    def describe(self) -> str:
        """The adaptable projections of one layer, by their checkpoint names (for error messages)."""
        names = []
        for name, linear in self.modules.items():
            if self.layer_of[name] == 0:
                names.extend(linear.part_names)
        return ", ".join(dict.fromkeys(names))
