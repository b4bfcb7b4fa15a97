"""EngineConfig: every engine knob in one object (filled by the gateway's settings)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

SchedulerPolicy = Literal["max_utilization", "guaranteed_no_evict"]
DTYPE_NAMES = ("bfloat16", "float16", "float32")  # what `dtype` may name besides "auto"


def _cpu_compile_default() -> bool:
    return os.environ.get("TRTLLM_GATEWAY_CPU_COMPILE", "true").lower() not in ("0", "false", "no", "off")


@dataclass
class EngineConfig:
    """Knobs of both backends. Field names match the CLI flags (`--max-batch-size` -> max_batch_size)."""

    # section: model and engine
    model: str | None = None  # checkpoint folder or .gguf file; "demo": the embedded demo model; unset: SmolLM2-135M-Instruct
    tokenizer: str | None = None  # tokenizer folder when it differs from `model`
    served_model_name: str | None = None  # default: the folder's name ("demo" for the demo model)
    backend: Literal["native", "trtllm"] = "native"  # native: our PyTorch runtime; trtllm: TensorRT-LLM (the trtllm extra)
    engine_process: bool = True  # native backend: run the engine core in its own process (off: in this one)
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    dtype: str = "auto"  # "auto" | "bfloat16" | "float16" | "float32" (auto on CPU: runtime/native/cpu/defaults.py)
    quantization: Literal["none", "fp8"] = "none"  # fp8: quantize a 16-bit checkpoint's projections to FP8 (per output channel) at load; FP8 checkpoints are served as FP8 either way (docs/quantization.md)
    # the INT4 kernels (runtime/native/cuda/int4.py) on an H200, 8B shape (benchmarks/RESULTS.md, 2026-11-29 ~10:55):
    # batch 1 0.85x bf16's time (3.45 vs 4.06 ms a token: the GEMV 2.6-4.4x its weight-bytes floor), but 256 requests
    # 0.31x bf16's throughput (the 256-row GEMM), so by default they are not used
    int4_kernels: bool = False  # AWQ/GPTQ on CUDA: keep the weights packed (a quarter of bf16's bytes, more room for the KV cache) and multiply through the Triton INT4 kernels; off: dequantized to the served dtype at load
    seed: int = 0  # seed of the sampler's random numbers for requests that give no seed
    max_model_len: int | None = None  # default: the model's context window
    # a runaway answer without max_tokens (a forced tool call's arguments degenerating) filled the 8192-token context
    # of the default model in 10 minutes on CPU; OpenAI's own limits are the model's output cap
    default_max_tokens: int | None = 2048  # most tokens a request without max_tokens generates, within the context window (none: up to its end, as vLLM)
    # section: batching and KV cache
    max_batch_size: int = 64  # most sequences in one step
    max_num_tokens: int | None = None  # tokens per step (prefill + decode); default: on a GPU, what keeps a step's prefill near 50 ms (8192 for a 1B model, 2048 for 8B, 4096 for 8B in FP8: runtime/native/step_tokens.py), 2048 on CPU
    max_queue_size: int = 1024  # waiting requests; over it: QueueFullError
    kv_block_size: int = 16  # tokens per KV block
    max_kv_tokens: int | None = None  # KV cache size in tokens; None: from kv_cache_fraction (GPU), one context window for the batch (CPU, runtime/native/kv_cache.py)
    kv_cache_fraction: float = 0.9  # of free device memory after weights (GPU)
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"  # fp8: keys and values stored as FP8 E4M3 (per-tensor scales from the checkpoint, else 1; saturating), twice the tokens in the same memory; auto: the model's dtype (docs/quantization.md)
    enable_prefix_caching: bool = True  # reuse the KV blocks of a prompt prefix computed before
    enable_chunked_prefill: bool = True  # split long prompts over several steps, beside running decodes
    scheduler_policy: SchedulerPolicy = "max_utilization"  # max_utilization: admit while blocks are free, preempting when they run out; guaranteed_no_evict: admit only what can finish
    max_beam_width: int = 4  # widest beam search a request may ask for
    # section: LoRA
    lora_modules: dict[str, str] = field(default_factory=dict)  # LoRA adapters served from the start, as NAME=PEFT folder
    max_loras: int = 8  # adapter slots on the device
    max_cpu_loras: int = 32  # adapters kept in host memory
    max_lora_rank: int = 64  # largest adapter rank accepted
    # section: speculative decoding
    speculative: Literal["none", "draft", "ngram", "eagle"] = "none"  # speculative decoding: a draft model proposes tokens, n-grams of the context do, or an EAGLE head over the target's hidden states
    draft_model: str | None = None  # the draft model's (or with --speculative eagle, the EAGLE head's) checkpoint folder; none: the served model's shipped one, where there is one
    # drafts per step: the default model's draft on CPU 1.16x at 2 vs 0.85x at 4 (acceptance 0.53 vs 0.38), n-gram on
    # the H100 2.27x vs 2.14x; only the demo pair's n-gram on CPU did better at 4 (1.70x vs 1.63x; benchmarks/RESULTS.md)
    num_draft_tokens: int = 2  # tokens proposed per speculative step
    ngram_min: int = 1  # shortest n-gram of the context matched to propose tokens (--speculative ngram)
    ngram_max: int = 4  # longest n-gram matched
    # no speculation in steps where more sequences decode (TRT-LLM's max_concurrency; None: always). On the H100
    # a draft model breaks even at 2 streams and loses at 4 (n-gram: 1.46x at 2, 1.02x at 4). A limit measured while
    # serving, per number of decoding sequences, lost to this one on the H200 (benchmarks/RESULTS.md, 2026-11-27)
    speculative_max_concurrency: int | None = 2  # no speculation in steps where more sequences decode (none: always)
    # under that limit, speculate at a number of decoding sequences only while measured steps show it faster than
    # plain ones (by 3%), trying the other kind now and then (runtime/native/speculative/guard.py; a compute-bound CPU lost
    # 0.49-0.82x at one stream without it). The native engine's; TensorRT-LLM gets the limit alone
    speculative_guard: bool = True  # plain steps where measured ones beat speculation (within the concurrency limit)
    # section: CPU execution
    cpu_threads: int | None = None  # torch threads of the native runtime on CPU; default $OMP_NUM_THREADS, else all cores but one
    # auto: what the checkpoint already was (the default model's Q4_1 layers: int4; float checkpoints: none), with bf16
    # activations where the CPU multiplies bf16 (runtime/native/cpu/defaults.py); logged in one line at start-up
    cpu_quantization: Literal["auto", "none", "int8", "int4"] = "auto"  # weight-only int4 (every product) or int8 (steps of few rows, beside prepacked bf16) forms of the projections (runtime/native/models/cpu_weights.py); auto: the checkpoint's own
    # The kernel is runtime/native/cpu/paged_attention.py, the compiled steps runtime/native/cpu/compiled_decode.py; both are built
    # in the background while eager steps serve. The default follows $TRTLLM_GATEWAY_CPU_COMPILE, so that a test
    # suite can turn it off for every engine it builds
    cpu_compile: bool = field(default_factory=_cpu_compile_default)  # build the C++ decode-attention kernel and, where it pays (float32, or with --cpu-quantization), compile one-stream decode steps
    # section: GPU execution
    enable_cuda_graphs: bool = True  # replay decode and prefill steps from captured CUDA graphs
    async_scheduling: bool | None = None  # prepare step N+1 while the device runs step N; default: on for CUDA
    data_parallel_size: int = 1  # native backend: engine cores, each a whole copy of the model on its own GPU (or tensor-parallel group), behind the same front end; a request goes to the least queued core, a cached prefix's core first (docs/scaling.md)
    tensor_parallel_size: int = 1  # GPUs each layer is split over, one process each (both backends; native: docs/tensor_parallel.md, also on the CPU over gloo)
    # section: streaming
    stream_interval: int = 1  # a stream's tokens go out in groups of this many (its first at once): fewer, larger events for less host work per token
    # section: TensorRT-LLM only
    pipeline_parallel_size: int = 1  # GPUs the layers are spread over, in stages
    trtllm_extra: dict[str, object] = field(default_factory=dict)  # pass-through LLM(...) kwargs

    def __post_init__(self) -> None:
        counts = {"stream_interval": self.stream_interval, "data_parallel_size": self.data_parallel_size,
                  "max_batch_size": self.max_batch_size, "max_num_tokens": self.max_num_tokens,
                  "kv_block_size": self.kv_block_size}
        for name, count in counts.items():  # refused at start-up, in one line, before any process starts
            if count is not None and count < 1:  # (a step of no sequences or tokens would never run a request)
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {count}")
        if self.data_parallel_size > 1 and (self.backend != "native" or not self.engine_process):
            raise ValueError("--data-parallel-size runs engine-core processes of the native backend: not with "
                             "--backend trtllm (use its own replicas) or --no-engine-process")
