"""The CUDA layer paths of the families of issue 43 (runtime/native/cuda/fused.py's fused layers and attention with q/k
norms, Gemma's norms, partial RoPE, windows and sinks; runtime/native/cuda/moe.py's experts) against the eager model on the
reference attention backend: a prefill past the sliding window, then decode steps. On a CUDA machine on the GPU,
elsewhere in Triton's interpreter (tests/triton_interpreter.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
from tests.triton_interpreter import RUN_HERE, kernels, run_in_interpreter  # noqa: E402

from runtime.native.models import attention, load_model  # noqa: E402
from tests.tiny_models import FAMILIES, build_tiny_model  # noqa: E402
from tests.unit.test_models import OTHER_PROMPT, PROMPT, PagedRunner  # noqa: E402

if RUN_HERE:
    from runtime.native.cuda.fused import use_fused_kernels
    from runtime.native.cuda.moe import use_fused_experts
    from runtime.native.cuda.paged_attention import triton_paged_attention


def test_kernels_in_triton_interpreter() -> None:
    run_in_interpreter(__file__, passed=len(FAMILIES) + 1)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _steps(model: torch.nn.Module, backend: object) -> torch.Tensor:
    """Logits of a 20-token prefill and three decode steps, attention through `backend`."""
    attention.register_attention_backend(DEVICE, backend)  # type: ignore[arg-type]
    try:
        runner = PagedRunner(model)
        out = [runner.step([("a", PROMPT + OTHER_PROMPT)])[0][-1:]]
        for token in (5, 250, 17):
            out.append(runner.step([("a", [token])])[0])
        return torch.cat(out)
    finally:
        attention.register_attention_backend(DEVICE, attention.torch_paged_attention)


def _load(path: Path, dtype: torch.dtype, arch: str) -> torch.nn.Module:
    return load_model(str(path), dtype, torch.device(DEVICE), 64 if arch == "phi3" else None)


@kernels
@pytest.mark.parametrize("arch", FAMILIES)
def test_fused_layers_equal_the_eager_model(arch: str, tmp_path: Path) -> None:
    path = build_tiny_model(tmp_path, arch)
    eager = _steps(_load(path, torch.float32, arch), attention.torch_paged_attention)
    model = _load(path, torch.float32, arch)
    assert use_fused_kernels(model) > 0
    assert use_fused_experts(model) == (arch in ("mixtral", "qwen3_moe", "gpt_oss")) * model.spec.num_layers - (
        arch == "qwen3_moe")  # Qwen3-MoE's second layer is dense
    fused = _steps(model, triton_paged_attention)
    assert ((fused - eager).norm() / eager.norm()).item() < 1e-4
    assert torch.equal(fused.argmax(-1), eager.argmax(-1))


@kernels
def test_one_token_gemv_path_of_a_moe_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """16-bit Qwen3-MoE: decode steps through the one-token path (q/k norms after the fused projection, the router's
    GEMV and the two one-token expert kernels in its MoE layers, the dense layer's GEMVs) and through the general
    fused path give the eager model's ids, within float16's rounding. float16, not bfloat16: Triton's interpreter
    multiplies bfloat16 tiles in tl.dot wrongly (its decode attention returned values near 1e9), and bfloat16's
    coarser rounding would let near-tied router logits pick other experts than the eager model's."""
    from runtime.native.cuda import fused as fused_module

    path = build_tiny_model(tmp_path, "qwen3_moe")
    eager = _steps(_load(path, torch.float16, "qwen3_moe"), attention.torch_paged_attention).float()
    for one_token in (True, False):
        model = _load(path, torch.float16, "qwen3_moe")
        use_fused_kernels(model)
        use_fused_experts(model)
        assert fused_module.one_token_projections(model.model)
        with monkeypatch.context() as patch:
            if not one_token:
                patch.setattr(fused_module, "one_token_projections", lambda _: False)
            steps = _steps(model, triton_paged_attention).float()
        assert ((steps - eager).norm() / eager.norm()).item() < 1e-2, one_token
        assert torch.equal(steps.argmax(-1), eager.argmax(-1)), one_token
