"""The fake tensorrt_llm follows the recorded real API, and the backend uses only recorded names.

tests/fakes/trtllm_api_snapshot.json holds the names read from NVIDIA/TensorRT-LLM (files and commits
listed there); an upstream rename shows up as a diff to that file, then as failures here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
import inspect
import sys

import pytest

from runtime.config import EngineConfig
from runtime.request import GenerationRequest, GuidedDecoding, SamplingOptions
from runtime.trtllm.api import TrtllmNotInstalledError, load_api
from tests.fakes.trtllm import fake_trtllm, load_snapshot  # noqa: F401  (fixture)
from tests.tiny_models import build_tiny_model

SNAP = load_snapshot()


def _params(fn) -> list[str]:
    return [p.name for p in inspect.signature(fn).parameters.values()
            if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]


def test_llm_functions_match_snapshot(fake_trtllm):
    from tensorrt_llm._tensorrt_engine import LLM as TrtLLM
    from tensorrt_llm.llmapi import LLM

    for cls in (LLM, TrtLLM):
        for name, spec in SNAP["functions"].items():
            fn = getattr(cls, name.split(".")[1])
            assert _params(fn) == spec["params"], name
        init = inspect.signature(cls.__init__).parameters.values()
        assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in init)


def test_dataclasses_match_snapshot(fake_trtllm):
    from tensorrt_llm.executor import CompletionOutput, Logprob, LoRARequest
    from tensorrt_llm.sampling_params import GuidedDecodingParams, SamplingParams

    for cls in (SamplingParams, GuidedDecodingParams, CompletionOutput, Logprob, LoRARequest):
        names = [f.name for f in dataclasses.fields(cls) if f.init]
        assert names == SNAP["classes"][cls.__name__]["fields"], cls.__name__
    for prop in SNAP["classes"]["CompletionOutput"]["properties"]:
        assert isinstance(inspect.getattr_static(CompletionOutput, prop), property), prop
    # keyword-only, like the real `@dataclass(slots=True, kw_only=True)`
    with pytest.raises(TypeError):
        SamplingParams(None, None, 5)


def test_pydantic_configs_match_snapshot(fake_trtllm):
    import tensorrt_llm.llmapi as llmapi
    from tensorrt_llm.lora_helper import LoraConfig

    classes = {"LoraConfig": LoraConfig}
    for name in ("KvCacheConfig", "SchedulerConfig", "DraftTargetDecodingConfig", "NGramDecodingConfig",
                 "EagleDecodingConfig", "MedusaDecodingConfig", "LookaheadDecodingConfig",
                 "MTPDecodingConfig"):
        classes[name] = getattr(llmapi, name)
    for name, cls in classes.items():
        assert list(cls.model_fields) == SNAP["classes"][name]["fields"], name
        if name != "LoraConfig":  # LoraConfig is a plain BaseModel upstream; the rest StrictBaseModel
            with pytest.raises(ValueError):
                cls(not_a_field=1)
    members = [m.name for m in llmapi.CapacitySchedulerPolicy]
    assert members == SNAP["classes"]["CapacitySchedulerPolicy"]["members"]


def test_generation_result_has_snapshot_attributes(fake_trtllm):
    from tensorrt_llm.executor import GenerationResult

    for attr in SNAP["classes"]["GenerationResult"]["attributes"]:
        assert hasattr(GenerationResult, attr), attr


def test_fake_llm_rejects_unknown_kwargs_like_the_real_one(fake_trtllm, tmp_path):
    from tensorrt_llm import LLM

    model = build_tiny_model(tmp_path, "llama")
    with pytest.raises(ValueError, match="LLM got invalid argument: max_queue_size"):
        LLM(model=str(model), max_queue_size=3)


def test_backend_passes_only_recorded_names(fake_trtllm, tmp_path):
    from runtime.trtllm.llm_config import llm_arguments
    from runtime.trtllm.lora import TrtllmAdapters
    from runtime.trtllm.model_folder import ModelFolder
    from runtime.trtllm.sampling import SamplingContext, sampling_kwargs

    model = build_tiny_model(tmp_path, "llama")
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}')
    api = load_api()
    cfg = EngineConfig(model=str(model), backend="trtllm", lora_modules={"a": str(adapter)},
                       speculative="draft", draft_model=str(model), enable_cuda_graphs=False)
    _, kwargs = llm_arguments(api, cfg, ModelFolder.inspect(str(model), None, None),
                              TrtllmAdapters(cfg.lora_modules, cfg.max_lora_rank))
    allowed = set(SNAP["classes"]["TorchLlmArgs"]["fields"]) | set(SNAP["functions"]["LLM.__init__"]["params"])
    assert set(kwargs) <= allowed
    for key, cls_name in (("kv_cache_config", "KvCacheConfig"), ("scheduler_config", "SchedulerConfig"),
                          ("lora_config", "LoraConfig"), ("speculative_config", "DraftTargetDecodingConfig")):
        assert set(kwargs[key].model_fields_set) <= set(SNAP["classes"][cls_name]["fields"]), key
    everything = SamplingOptions(
        max_tokens=5, temperature=0.5, top_k=3, top_p=0.9, min_p=0.1, repetition_penalty=1.1,
        presence_penalty=0.2, frequency_penalty=0.3, min_tokens=1, bad_words=["x"], seed=1,
        stop_token_ids=[7], ignore_eos=False, n=2, logprobs=2, prompt_logprobs=1,
        return_context_logits=True, return_generation_logits=True, skip_special_tokens=False)
    req = GenerationRequest("r", prompt="hi", sampling=everything)
    # guided decoding refuses min_tokens on this backend (it could not end at the grammar's end)
    guided = GenerationRequest("g", prompt="hi", sampling=replace(everything, min_tokens=0),
                               guided=GuidedDecoding(regex="a+"))
    ctx = SamplingContext(context_window=256, vocab_size=300, eos_token_ids=(0, 2), default_seed=0,
                          default_max_tokens=None, max_beam_width=4, speculative=False)
    for r in (req, guided):
        assert set(sampling_kwargs(r, 3, ctx)) <= set(SNAP["classes"]["SamplingParams"]["fields"])
    beam = GenerationRequest("b", prompt="hi", sampling=SamplingOptions(beam_width=2, length_penalty=0.5))
    assert set(sampling_kwargs(beam, 3, ctx)) <= set(SNAP["classes"]["SamplingParams"]["fields"])


def test_missing_tensorrt_llm_fails_start_up_with_one_clear_line(monkeypatch, tmp_path):
    from runtime.trtllm.engine import TrtllmEngine

    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # import tensorrt_llm -> ImportError
    model = build_tiny_model(tmp_path, "llama")
    with pytest.raises(TrtllmNotInstalledError) as info:
        TrtllmEngine(EngineConfig(model=str(model), backend="trtllm"))
    message = str(info.value)
    assert "\n" not in message
    assert message.endswith("install it with `pip install '.[trtllm]'` in the trtllm-gateway checkout, "
                            "or `pip install 'tensorrt-llm>=1.2,<1.3'`")


def test_only_runtime_trtllm_api_imports_tensorrt_llm():
    """The issue's rule: nothing but runtime/trtllm/api.py imports tensorrt_llm (the native install stays
    free of it). Scans every shipped module's import statements."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    importers = []
    for package in ("gateway", "runtime", "adapters", "benchmarks"):
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n == "tensorrt_llm" or n.startswith("tensorrt_llm.") for n in names):
                    importers.append(path.relative_to(root).as_posix())
    assert sorted(set(importers)) == ["runtime/trtllm/api.py"]
