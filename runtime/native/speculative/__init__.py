"""Speculative decoding for the native runtime: draft-model and n-gram proposers, exact verification.

- ngram.py: NgramProposer (prompt lookup, no model);
- draft.py: DraftProposer (a small model with its own paged KV cache) and the tokenizer check;
- verifier.py: verify_greedy() (longest agreeing prefix) and verify_sampled() (rejection sampling);
- rows.py: TargetRows, the target's sampling rows after each draft prefix;
- guard.py: SpeculationGuard, speculates only where measured steps show it faster than plain ones;
- speculator.py: Speculator, the engine's per-step hooks (plan, patch_inputs, verify, emit).

`use_draft_logits` (Triton) is accepted and has no effect here: draft-model proposals are always
verified with the draft's probabilities, n-gram proposals as one-hot ones; both are exact.
"""

from __future__ import annotations

import torch

from runtime.native.block_manager import BlockManager
from runtime.native.model_runner import ModelRunner
from runtime.native.models.base import CausalLM
from runtime.native.models.cpu_weights import Quantization
from runtime.config import EngineConfig
from runtime.native.speculative.draft import (
    DraftProposer,
    DraftTokenizerMismatchError,
    check_same_tokenizer,
)
from runtime.native.speculative.eagle import EagleProposer
from runtime.native.speculative.guard import SpeculationGuard
from runtime.native.speculative.ngram import NgramProposer
from runtime.native.speculative.speculator import SpecCounters, Speculator
from runtime.native.speculative.verifier import Verdict, verify_greedy, verify_sampled
from runtime.tokenizer import Tokenizer

__all__ = [
    "DraftProposer", "DraftTokenizerMismatchError", "EagleProposer", "NgramProposer", "SpecCounters", "Speculator", "Verdict",
    "build_speculator", "load_proposer", "resolve_draft_path", "resolve_eagle_path", "verify_greedy", "verify_sampled",
]


def resolve_draft_path(config: EngineConfig, serving_demo: bool) -> str:
    """--draft-model, or the shipped draft of the model served: the demo model's, or the default model's
    distilled one (no --model; tools/demo_training/train_default_draft.py)."""
    if config.draft_model is not None:
        return config.draft_model
    if serving_demo:
        from runtime.demo import demo_draft_path

        return demo_draft_path()
    if config.model is None:
        from runtime.default_model import resolve_model
        from runtime.demo import default_draft_path

        return default_draft_path(resolve_model(None, config.dtype)[0])  # the engine's own folder, cached
    raise ValueError("--speculative draft needs --draft-model DIR (a small model with the target's tokenizer)")


def resolve_eagle_path(config: EngineConfig) -> str:
    """--draft-model, or the default model's shipped EAGLE head (no --model; runtime/demo/smollm2_eagle)."""
    if config.draft_model is not None:
        return config.draft_model
    if config.model is None:
        from runtime.demo import DEFAULT_EAGLE_DIR

        return str(DEFAULT_EAGLE_DIR)
    raise ValueError("--speculative eagle needs --draft-model DIR (an EAGLE head trained for the served model)")


def eagle_chain_slots(config: EngineConfig, device: torch.device) -> int:
    """Sequences whose EAGLE drafting runs as one CUDA graph a proposal (eagle_chain.py): as many as may speculate at
    once; none without CUDA graphs (op by op, the chain's static state buys nothing)."""
    if device.type != "cuda" or not config.enable_cuda_graphs:
        return 0
    return config.speculative_max_concurrency or 4


def load_proposer(config: EngineConfig, *, serving_demo: bool, tokenizer: Tokenizer, vocab_size: int,
                  dtype: torch.dtype, device: torch.device, target: CausalLM, runner: ModelRunner,
                  cpu_quantization: Quantization = "none") -> NgramProposer | DraftProposer | EagleProposer | None:
    """The configured proposer (the draft model is loaded here, before the KV caches are sized; an EAGLE head reads
    the target's embedding, lm_head and the hidden states its `runner` keeps, and on CPU takes the target's weight-only
    `cpu_quantization`)."""
    if config.speculative == "none":
        return None
    if config.num_draft_tokens < 1:
        raise ValueError(f"--num-draft-tokens must be >= 1 with --speculative {config.speculative}")
    if config.speculative_max_concurrency is not None and config.speculative_max_concurrency < 1:
        raise ValueError(f"--speculative-max-concurrency must be >= 1, got {config.speculative_max_concurrency}")
    if config.speculative == "ngram":
        return NgramProposer(config.ngram_min, config.ngram_max)
    if config.speculative == "eagle":
        return EagleProposer(resolve_eagle_path(config), target, runner, dtype, device, config.num_draft_tokens,
                             eagle_chain_slots(config, device), cpu_quantization)
    if config.speculative != "draft":
        raise ValueError(f"unknown --speculative {config.speculative!r} (none, draft, ngram, eagle)")
    path = resolve_draft_path(config, serving_demo)
    check_same_tokenizer(tokenizer, path)
    return DraftProposer(path, vocab_size, dtype, device, config.kv_block_size)


def build_speculator(proposer: NgramProposer | DraftProposer | EagleProposer, config: EngineConfig, block_manager: BlockManager,
                     context_window: int, *, cuda_graphs: bool = False) -> Speculator:
    """The engine's hook object, once the target's KV cache exists (the draft's cache gets as many blocks).

    `cuda_graphs`: the target captured CUDA graphs; the draft then captures its own, for steps of up to
    two tokens per sequence (a draft step feeds one; catching up after a verification feeds at most the
    last draft and the bonus token) and the target's block-table width. Longer catch-ups (a prompt, a
    step without speculation) run eager."""
    if isinstance(proposer, DraftProposer):
        graphs = (2 * config.max_batch_size, -(-context_window // config.kv_block_size)) if cuda_graphs else None
        proposer.allocate(block_manager.num_blocks, graphs)
    return Speculator(proposer, num_draft_tokens=config.num_draft_tokens, block_manager=block_manager,
                      max_num_tokens=config.max_num_tokens, context_window=context_window, seed=config.seed,
                      max_concurrency=config.speculative_max_concurrency,
                      guard=SpeculationGuard() if config.speculative_guard else None)
