"""The fake LLM (real: NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm.py @ 4c05a74891e4df8066f08ed4ce14b0972abe4e25,
classes BaseLLM, _TrtLLM, _TorchLLM and LLM).

Behaviour kept from the real file:
- The constructor refuses keywords that are not fields of TorchLlmArgs / TrtLlmArgs, and (as the args'
  validate_speculative_config) a speculative config whose supports_backend(backend) is false: backend
  "pytorch" for LLM, None for the TensorRT-engine LLM. The engine LLM takes its build_config from the
  engine folder's config.json (TrtLlmArgs._load_config_from_engine).
- generate_async: _prepare_sampling_params (SamplingParams._setup, which tokenizes `bad` and `stop`, runs
  only when end_id is None; on the TensorRT backend prompt_logprobs / logprobs switch return_context_logits /
  return_generation_logits on), then _check_arguments (PyTorch: without chunked prefill a prompt over
  max_num_tokens is refused; TensorRT: prompt + max_tokens within the engine's max_seq_len, beam width, n
  within max_batch_size, prompt_logprobs only on an engine built with gather_context_logits, logprobs only
  with gather_generation_logits=True passed to the LLM), then the executor (executor/executor.py).
- get_stats / get_stats_async are the executor's (the shared IterationResult).
The PyTorch-backend LLM runs the Hugging Face checkpoint in `model` with transformers on the CPU
(executor/worker.py); guided decoding is modelled with xgrammar as the PyTorch backend does it (_guided.py).
Not modelled: beam search, LoRA weights (adapters are validated, not applied), speculative decoding (configs
are validated, then decoding is plain), TensorRT engines (requests are accepted, never run).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, List, Literal, Optional, Union

from tensorrt_llm.executor.executor import GenerationExecutor
from tensorrt_llm.executor.request import LoRARequest
from tensorrt_llm.executor.result import GenerationResult
from tensorrt_llm.executor.worker import TorchEngine
from tensorrt_llm.llmapi.llm_args import (TORCH_LLM_ARGS, TRT_LLM_ARGS, CudaGraphConfig, DecodingBaseConfig,
                                          KvCacheConfig, SchedulerConfig)
from tensorrt_llm.lora_helper import LoraConfig
from tensorrt_llm.sampling_params import SamplingParams

RequestOutput = GenerationResult

_TYPED_ARGS = {"kv_cache_config": KvCacheConfig, "scheduler_config": SchedulerConfig,
               "lora_config": LoraConfig, "speculative_config": DecodingBaseConfig,
               "cuda_graph_config": CudaGraphConfig}


class BaseLLM:
    """Shared constructor checks and request path of both LLM classes."""

    _valid_args: frozenset[str] = TORCH_LLM_ARGS
    _backend: Optional[str] = "pytorch"

    def __init__(self, model: Union[str, Path], tokenizer: Optional[Union[str, Path, Any]] = None,
                 tokenizer_mode: Literal["auto", "slow"] = "auto", skip_tokenizer_init: bool = False,
                 trust_remote_code: bool = False, tensor_parallel_size: int = 1, dtype: str = "auto",
                 revision: Optional[str] = None, tokenizer_revision: Optional[str] = None,
                 **kwargs: Any) -> None:
        for key in kwargs:
            if key not in self._valid_args | {"backend", "_mpi_session"}:
                raise ValueError(f"{self.__class__.__name__} got invalid argument: {key}")
        for key, cls in _TYPED_ARGS.items():
            if kwargs.get(key) is not None and not isinstance(kwargs[key], cls):
                raise ValueError(f"{key} must be a {cls.__name__}, got {type(kwargs[key]).__name__}")
        spec = kwargs.get("speculative_config")
        if spec is not None and not spec.supports_backend(self._backend):
            raise ValueError(f"Speculation type {spec.decoding_type} does not support backend {self._backend}")
        self.args = dict(model=str(model), tokenizer=tokenizer, tokenizer_mode=tokenizer_mode,
                         skip_tokenizer_init=skip_tokenizer_init, trust_remote_code=trust_remote_code,
                         tensor_parallel_size=tensor_parallel_size, dtype=dtype, revision=revision,
                         tokenizer_revision=tokenizer_revision, **kwargs)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or model), local_files_only=True)
        self._executor: Optional[GenerationExecutor] = GenerationExecutor(self._make_engine(), self.tokenizer)

    def _make_engine(self) -> Optional[TorchEngine]:
        return None

    # -- the public API ----------------------------------------------------------------------------

    def generate_async(self, inputs: Any, sampling_params: Optional[SamplingParams] = None,
                       lora_request: Optional[LoRARequest] = None,
                       prompt_adapter_request: Optional[Any] = None, streaming: bool = False,
                       kv_cache_retention_config: Optional[Any] = None,
                       disaggregated_params: Optional[Any] = None, _postproc_params: Optional[Any] = None,
                       scheduling_params: Optional[Any] = None,
                       cache_salt: Optional[str] = None) -> RequestOutput:
        """Submit one prompt (text, token ids or {"prompt_token_ids": [...]}) and return its result."""
        if self._executor is None or self._executor.is_shutdown():
            raise RuntimeError("LLM is shutting down")
        sampling_params = self._prepare_sampling_params(sampling_params)
        prompt = self._prompt_ids(inputs, sampling_params)
        self._check_arguments(len(prompt), 0, sampling_params, is_gen_only=False)
        return self._executor.generate_async(prompt, sampling_params, lora_request, streaming)

    def get_stats(self, timeout: Optional[float] = 2) -> List[dict]:
        """Iteration statistics from the runtime."""
        return self._executor.get_stats(timeout=timeout)

    def get_stats_async(self, timeout: Optional[float] = 2) -> Any:
        """Iteration statistics from the runtime, as an async iterable (IterationResult)."""
        return self._executor.aget_stats(timeout=timeout)

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None

    def __enter__(self) -> "BaseLLM":
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.shutdown()
        return False

    # -- internals -----------------------------------------------------------------------------------

    def _prepare_sampling_params(self, sampling_params: Optional[SamplingParams]) -> SamplingParams:
        if sampling_params is None:
            sampling_params = SamplingParams()
        if not isinstance(sampling_params, SamplingParams):
            raise TypeError(f"The sampling_params must be type SamplingParams or None, but got "
                            f"{type(sampling_params)}")
        if sampling_params.end_id is None:
            sampling_params._setup(self.tokenizer, None, None)
        if self._backend != "pytorch":  # logprobs are computed from logits on the TensorRT backend
            if sampling_params.prompt_logprobs and not sampling_params.return_context_logits:
                sampling_params.return_context_logits = True
                sampling_params._context_logits_auto_enabled = True
            if sampling_params.logprobs and not sampling_params.return_generation_logits:
                sampling_params.return_generation_logits = True
                sampling_params._generation_logits_auto_enabled = True
        if sampling_params._stream_interval is None:
            sampling_params._stream_interval = self.args.get("stream_interval") or 1
        sampling_params.return_perf_metrics = sampling_params.return_perf_metrics or bool(
            self.args.get("return_perf_metrics"))
        return sampling_params

    def _check_arguments(self, prompt_len: int, query_len: int, sampling_params: SamplingParams,
                         is_gen_only: bool) -> None:
        max_num_tokens = self.args.get("max_num_tokens")
        if not self.args.get("enable_chunked_prefill") and max_num_tokens and prompt_len + query_len > max_num_tokens:
            raise ValueError(f"The sum of prompt length ({prompt_len}), query length ({query_len}) should not "
                             f"exceed max_num_tokens ({max_num_tokens})")

    def _prompt_ids(self, inputs: Any, sp: SamplingParams) -> List[int]:
        if isinstance(inputs, dict):
            inputs = inputs.get("prompt_token_ids", inputs.get("prompt"))
        if isinstance(inputs, str):
            return list(self.tokenizer.encode(inputs, add_special_tokens=sp.add_special_tokens))
        if isinstance(inputs, list) and all(isinstance(t, int) for t in inputs):
            return list(inputs)
        raise TypeError(f"The inputs must be type str or list of int, but got {type(inputs)}")


class _TrtLLM(BaseLLM):
    """LLM over a TensorRT engine folder (tensorrt_llm._tensorrt_engine.LLM); its requests never run here."""

    _valid_args = TRT_LLM_ARGS
    _backend = None

    def __init__(self, model: Union[str, Path], tokenizer: Optional[Union[str, Path, Any]] = None,
                 tokenizer_mode: Literal["auto", "slow"] = "auto", skip_tokenizer_init: bool = False,
                 trust_remote_code: bool = False, tensor_parallel_size: int = 1, dtype: str = "auto",
                 revision: Optional[str] = None, tokenizer_revision: Optional[str] = None,
                 **kwargs: Any) -> None:
        with open(Path(model) / "config.json", encoding="utf-8") as f:
            config = json.load(f)
        if "build_config" not in config:
            raise ValueError(f"{model} is not a TensorRT engine folder (no build_config)")
        self.build_config: dict = config["build_config"]
        super().__init__(model, tokenizer, tokenizer_mode, skip_tokenizer_init, trust_remote_code,
                         tensor_parallel_size, dtype, revision, tokenizer_revision, **kwargs)

    def _check_arguments(self, prompt_len: int, query_len: int, sampling_params: SamplingParams,
                         is_gen_only: bool) -> None:
        build, sp = self.build_config, sampling_params
        max_seq_len = build["max_seq_len"]
        if not self.args.get("enable_chunked_prefill") and prompt_len + query_len + (sp.max_tokens or 0) > max_seq_len:
            raise ValueError(f"The sum of prompt length ({prompt_len}) and query length ({query_len}) max_tokens "
                             f"({sp.max_tokens}) should not exceed max_seq_len ({max_seq_len})")
        max_beam_width = self.args.get("max_beam_width") or build.get("max_beam_width", 1)
        if sp.use_beam_search and sp.best_of > max_beam_width:
            raise ValueError(f"sampling_params.n ({sp.n}) cannot exceed max_beam_width ({max_beam_width}) when "
                             "use_beam_search is True")
        max_batch_size = self.args.get("max_batch_size") or build.get("max_batch_size", 2048)
        if not sp.use_beam_search and sp.best_of > max_batch_size:
            raise ValueError(f"sampling_params.n ({sp.n}) cannot exceed max_batch_size ({max_batch_size}) when "
                             "use_beam_search is False")
        if sp.prompt_logprobs and not build.get("gather_context_logits"):
            raise ValueError(f"`sampling_params's prompt_logprobs={sp.prompt_logprobs}` requires "
                             "`gather_context_logits=True` in the `BuildConfig` when constructing the LLM. "
                             "Example: LLM(..., build_config=BuildConfig(gather_context_logits=True)).")
        if sp.logprobs and not self.args.get("gather_generation_logits"):
            raise ValueError(f"`sampling_params.logprobs={sp.logprobs}` requires `gather_generation_logits=True` "
                             "to be passed explicitly to the `LLM()` constructor.")


class _TorchLLM(BaseLLM):
    """PyTorch-backend LLM over a Hugging Face checkpoint folder."""

    def _make_engine(self) -> TorchEngine:
        kv = self.args.get("kv_cache_config") or KvCacheConfig()
        return TorchEngine(self.args["model"], self.tokenizer, max_batch_size=self.args.get("max_batch_size") or 2048,
                           max_num_tokens=self.args.get("max_num_tokens") or 8192,
                           tokens_per_block=kv.tokens_per_block, max_kv_tokens=kv.max_tokens,
                           stats_on=bool(self.args.get("enable_iter_perf_stats")))


class LLM(_TorchLLM):
    """LLM class is the main class for running a LLM model (PyTorch backend)."""
