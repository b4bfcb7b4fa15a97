"""Building an EngineCore from the settings: model description, weights, KV cache, graphs, LoRA, speculation.

    model = describe_model(config)       # folder, spec, device, dtype, ModelInfo: no weights read
    loaded = load_core(config, model)    # blocking (seconds to minutes); the in-process engine runs it in a thread
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from runtime.native.block_manager import BlockManager
from runtime.config import EngineConfig
from runtime.native.cpu.defaults import CpuFeatures, cpu_dtype, cpu_quantization, log_choice, source_quantization
from runtime.native.cpu.native_decode import NativeDecode, supports
from runtime.native.cpu.paged_attention import build_kernel, use_cpu_kernels
from runtime.native.cpu.warm_up import CpuWarmUp
from runtime.default_model import DEMO
from runtime.native.device import (
    DTYPES,
    cpu_thread_count,
    dtype_name,
    resolve_device,
    resolve_dtype,
)
from runtime.engine import ModelInfo
from runtime.native.engine_core import EngineCore
from runtime.native.kv_cache import num_kv_blocks
from runtime.native.lora import LoraManager
from runtime.native.model_runner import ModelRunner
from runtime.model_spec import ModelSpec
from runtime.native.models import kv_cache_bytes_per_token, load_model
from runtime.native.models.attention import attention_layers
from runtime.native.models.cpu_weights import prepare_cpu_weights
from runtime.native.models.fp8 import native_fp8
from runtime.native.models.fp8_checkpoint import checkpoint_is_fp8
from runtime.native.models.kv_scales import FP8, describe_kv_scales
from runtime.native.parallel.workers import Workers
from runtime.native.sampler import Sampler
from runtime.native.scheduler import Scheduler
from runtime.served_model import describe_served_model
from runtime.native.speculative import build_speculator, load_proposer
from runtime.native.speculative.eagle import EagleProposer
from runtime.native.step_tokens import default_max_num_tokens
from runtime.startup import StartupPhases
from runtime.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelDescription:
    """The checkpoint to serve and how, known before any weight is read."""

    path: str
    spec: ModelSpec
    device: torch.device
    dtype: torch.dtype
    info: ModelInfo  # what the gateway is told


def describe_model(config: EngineConfig) -> ModelDescription:
    """What `config` serves and on which device and dtype, without loading weights; ValueError names what we do not
    serve."""
    served = describe_served_model(config)
    device = resolve_device(config.device)
    if device.type == "cpu":
        dtype = cpu_dtype(config.dtype, DTYPES[served.spec.dtype], source_quantization(served.spec.config),
                          CpuFeatures.detect())
    else:
        dtype = resolve_dtype(config.dtype, device, DTYPES[served.spec.dtype])
    fp8_products = native_fp8(device) and (config.quantization == "fp8"
                                           or checkpoint_is_fp8(Path(served.path), served.spec.config))
    info = dataclasses.replace(served.info, dtype=dtype_name(dtype), device=str(device), max_num_tokens=(
        config.max_num_tokens or default_max_num_tokens(served.spec, device.type, fp8_products)))
    return ModelDescription(served.path, served.spec, device, dtype, info)


@dataclass
class LoadedCore:
    """A loaded engine core and what its driver needs beside it."""

    core: EngineCore
    tokenizer: Tokenizer
    eos_token_ids: list[int]  # the tokenizer's and the checkpoint's
    memory_bytes: dict[str, int]  # weights and KV cache, by where they live
    cpu_warm_up: CpuWarmUp | None  # the CPU's kernel and compiled steps, to build in the background once serving


def load_core(config: EngineConfig, model: ModelDescription, phases: StartupPhases,
              on_lora_ready: Callable[[], None], stopping: Callable[[], bool],
              on_worker_failure: Callable[[str], None] = lambda reason: None) -> LoadedCore:
    """Load tokenizer, weights and KV cache, capture graphs, and build the core (blocking). `phases` says what it is
    doing; `stopping()`: the engine no longer serves (the CPU's background warm-up then gives up);
    `on_worker_failure(reason)`: a tensor-parallel worker died (runtime/native/parallel/workers.py)."""
    if config.max_num_tokens is None:
        logger.info("steps of up to %d tokens (--max-num-tokens: the default for this model on %s)",
                    model.info.max_num_tokens, model.device.type)
    config = dataclasses.replace(config, max_num_tokens=model.info.max_num_tokens)  # resolved: every part reads it
    peers = None
    if config.tensor_parallel_size < 1:
        raise ValueError(f"--tensor-parallel-size must be at least 1, got {config.tensor_parallel_size}")
    if config.tensor_parallel_size > 1:
        check_tensor_parallel(config)
        with phases.phase(f"starting {config.tensor_parallel_size - 1} tensor-parallel workers"):
            peers = Workers(config, model.device, on_worker_failure)
    try:
        return _load(config, model, phases, on_lora_ready, stopping, peers)
    except BaseException:
        if peers is not None:
            peers.stop()
        raise


def check_tensor_parallel(cfg: EngineConfig) -> None:
    """ValueError naming an option that --tensor-parallel-size does not serve yet."""
    unsupported = {"--speculative draft": cfg.speculative == "draft", "--speculative eagle": cfg.speculative == "eagle",
                   "--cpu-quantization": cfg.cpu_quantization not in ("auto", "none"),
                   "--quantization fp8": cfg.quantization != "none"}
    named = [option for option, on in unsupported.items() if on]
    if named:
        raise ValueError(f"--tensor-parallel-size {cfg.tensor_parallel_size} does not serve {', '.join(named)} yet")


def _load(cfg: EngineConfig, model: ModelDescription, phases: StartupPhases, on_lora_ready: Callable[[], None],
          stopping: Callable[[], bool], peers: Workers | None) -> LoadedCore:
    device, dtype, spec = model.device, model.dtype, model.spec
    if device.type == "cpu":
        torch.set_num_threads(cpu_thread_count(cfg.cpu_threads))  # process-wide: the step thread's matmuls
    with phases.phase("loading the tokenizer"):
        tokenizer = Tokenizer.from_pretrained(cfg.tokenizer or model.path)
    eos_token_ids = list(dict.fromkeys(tokenizer.eos_token_ids + spec.eos_token_ids))
    window = model.info.context_window
    with phases.phase("loading the weights"):
        weights = load_model(model.path, dtype, device, window, cfg.quantization, cfg.int4_kernels)
    quantization, cpu_weight_bytes = "none", 0
    if device.type == "cpu":
        quantization = cpu_quantization(cfg.cpu_quantization, source_quantization(spec.config))
        if peers is not None and quantization != "none":
            raise ValueError(f"--tensor-parallel-size does not serve --cpu-quantization {quantization} yet")
        use_cpu_kernels(False)  # until the kernel is built (runtime/native/cpu/warm_up.py), whatever engines did before
        if quantization != "none":
            with phases.phase("building the CPU kernels"):  # the quantized products need them (cached after a first start)
                if not build_kernel():
                    logger.warning("CPU: no kernels for --cpu-quantization %s; serving without it", quantization)
                    quantization = "none"
        cpu_weight_bytes = prepare_cpu_weights(weights, quantization)
        if cpu_weight_bytes:
            logger.info("CPU: %s weights (%+.0f MB)", "prepacked" if quantization == "none" else
                        f"{quantization} weight-only", cpu_weight_bytes / 2**20)
    runner = ModelRunner(weights, cfg.kv_block_size, Sampler(cfg.seed))
    runner.peers = peers
    lora = LoraManager(cfg, weights, on_ready=on_lora_ready)
    if peers is not None:
        lora.slots.on_change = peers.lora_changed
    runner.lora = lora.batch
    proposer = load_proposer(cfg, serving_demo=cfg.model == DEMO, tokenizer=tokenizer, vocab_size=spec.vocab_size,
                             dtype=dtype, device=device, target=weights, runner=runner, cpu_quantization=quantization)
    activations = runner.profile_activation_bytes(cfg.max_num_tokens, cfg.max_batch_size, window)
    kv_dtype = FP8 if cfg.kv_cache_dtype == "fp8" else dtype
    bytes_per_token = kv_cache_bytes_per_token(spec, kv_dtype)
    bytes_per_token += getattr(proposer, "kv_bytes_per_token", 0)  # a draft model's cache gets as many blocks
    blocks = num_kv_blocks(cfg, bytes_per_token, window, device, activations)
    # a compiled step on CPU pays with --cpu-quantization or float32 (not against the prepacked bf16 products,
    # which inductor cannot call: 45 vs 52 ms a SmolLM2 step on the 2-core box, RESULTS.md); it is warmed up
    # in one more block, which the block manager never hands out
    # the CPU's C++ and compiled steps read 16- or 32-bit caches (an FP8 cache runs eager over the reference
    # attention) and do not tell the other tensor-parallel ranks (eager steps there); they hand out the final hidden
    # states an EAGLE head reads, not the inputs of the target's layers that an EAGLE-3 head reads (which only steps
    # run op by op keep: runtime/native/speculative/eagle.py)
    cpu_steps = (device.type == "cpu" and cfg.cpu_compile and kv_dtype == dtype and peers is None
                 and not (isinstance(proposer, EagleProposer) and proposer.reads_layer_inputs))
    native = cpu_steps and supports(weights) is None
    compile_steps = cpu_steps and not native and (quantization != "none" or dtype != torch.bfloat16)
    runner.allocate_kv_cache(blocks + compile_steps, kv_dtype)
    if kv_dtype == FP8:
        logger.info(describe_kv_scales(attention_layers(weights)))
    # a speculative step brings 1 + num_draft_tokens rows per sequence
    decode_rows = cfg.max_batch_size * (1 + (cfg.num_draft_tokens if proposer is not None else 0))
    max_blocks = -(-window // cfg.kv_block_size)
    eagle = isinstance(proposer, EagleProposer)
    if cfg.enable_cuda_graphs and device.type == "cuda" and eagle and proposer.reads_layer_inputs:
        logger.warning("--speculative eagle with an EAGLE-3 head on CUDA: no CUDA graphs (they hand out no inputs of "
                       "the target's layers), so every step runs op by op: much slower than plain decoding for now")
    elif cfg.enable_cuda_graphs and device.type == "cuda":
        # (under EAGLE they also hand out the final hidden states: runner.keep_hidden)
        runner.capture_decode_graphs(decode_rows, max_blocks, lora_version=lambda: lora.slots.version)
        # (not under tensor parallelism: those steps run op by op; under EAGLE prefill graphs hand out the hidden
        # states too, and mixed graphs, which do not, are not captured)
        if peers is None:
            runner.capture_prefill_graphs(cfg.max_num_tokens, max_blocks, lora_version=lambda: lora.slots.version)
        if eagle:
            logger.warning("--speculative eagle on CUDA: measured slower than plain decoding at one stream (0.96x with "
                           "the default model on an H200, 2026-11-29: a speculative step waits for its drafts and its "
                           "verification in turn; docs/speculative_decoding.md)")
    cpu_warm_up = None
    if native:  # its kernels are built: it serves from the first step
        use_cpu_kernels(True)
        runner.graphs = NativeDecode(weights, runner.kv_caches, cfg.kv_block_size, max_blocks, lora.batch)
    elif cpu_steps:
        cpu_warm_up = CpuWarmUp(runner, phases, compile_steps, max_blocks, scratch_block=blocks, stopping=stopping)
    if device.type == "cpu":
        steps = ("C++ decode steps" if native else "compiled one-stream steps (built in the background)"
                 if compile_steps else "eager steps")
        log_choice(dtype, quantization, torch.get_num_threads(), steps, CpuFeatures.detect())
    # blocks outside every layer's window are given back, unless a draft model (full attention) reads them
    sliding = spec.sliding_window if cfg.speculative != "draft" else None
    block_manager = BlockManager(blocks, cfg.kv_block_size, cfg.enable_prefix_caching, sliding)
    runner.block_tables = block_manager.tables
    scheduler = Scheduler(block_manager, max_batch_size=cfg.max_batch_size, max_num_tokens=cfg.max_num_tokens,
                          policy=cfg.scheduler_policy, enable_chunked_prefill=cfg.enable_chunked_prefill)
    speculator = None
    if proposer is not None:
        speculator = build_speculator(proposer, cfg, block_manager, window,
                                      cuda_graphs=device.type == "cuda" and runner.graphs is not None)
    async_scheduling = device.type == "cuda" if cfg.async_scheduling is None else cfg.async_scheduling
    core = EngineCore(runner, scheduler, lora, speculator, async_scheduling=async_scheduling)
    param_bytes = sum(p.numel() * p.element_size() for p in weights.parameters()) + cpu_weight_bytes
    param_bytes += getattr(proposer, "weight_bytes", 0) + getattr(getattr(proposer, "runner", None), "kv_cache_bytes", 0)
    memory = {"gpu" if device.type == "cuda" else "cpu": param_bytes + runner.kv_cache_bytes}
    return LoadedCore(core, tokenizer, eos_token_ids, memory, cpu_warm_up)
