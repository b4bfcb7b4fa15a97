"""Train the embedded demo model and its draft, reproducibly, on CPU.

    python -m tools.demo_training.train            # full run: writes runtime/demo/{model,draft,TRAINING.md}
    python -m tools.demo_training.train --quick --out /tmp/demo   # a few steps, to check the script works

Corpus: the running interpreter's standard library (tools/demo_training/corpus.py). Tokenizer: byte-level BPE
with ChatML tokens and a tools-aware chat template. Models: transformers LlamaForCausalLM (GQA, SwiGLU,
tied embeddings), trained with AdamW and a cosine schedule; a fraction of samples are chat-wrapped.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
)

from tools.demo_training.corpus import load_corpus
from tools.demo_training.dataset import BatchSampler, chat_stream, code_stream, eval_windows
from tools.demo_training.evaluation import greedy_text, heldout_loss, perplexity, unigram_loss
from tools.demo_training.report import ModelResult, RunInfo, write_report
from tools.demo_training.tokenizer_build import (
    ENDOFTEXT,
    IM_END,
    save_tokenizer,
    train_tokenizer,
)

PACKAGE_DIR = Path(__file__).resolve().parent
SAMPLE_PROMPTS = ("def fibonacci(n):", "import os\n", "class Stack:\n    def __init__(self):\n")
CHAT_PROMPT = [{"role": "user", "content": "Continue this Python code:\ndef add(a, b):"}]


@dataclass(frozen=True)
class ModelShape:
    """Size and training schedule of one model."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    steps: int
    lr: float


# Sized so both models train in about 30 minutes on 2 shared CPU cores (see TRAINING.md for figures).
TARGET = ModelShape(hidden=256, intermediate=704, layers=6, heads=8, kv_heads=2, steps=700, lr=2e-3)
DRAFT = ModelShape(hidden=128, intermediate=352, layers=3, heads=4, kv_heads=2, steps=500, lr=3e-3)


def llama_config(shape: ModelShape, vocab_size: int, bos_id: int, eos_ids: list[int]) -> LlamaConfig:
    """A LlamaConfig for `shape`: GQA, SwiGLU, tied embeddings, 2048 positions, rope_theta 10000."""
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        hidden_act="silu",
        max_position_embeddings=2048,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_ids,
        pad_token_id=bos_id,
    )


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + torch.cos(torch.tensor(progress * torch.pi)).item()))


def train_model(
    name: str, config: LlamaConfig, shape: ModelShape, sampler: BatchSampler, seed: int, bf16: bool
) -> tuple[LlamaForCausalLM, float]:
    """Train one model from a seeded init; returns it (fp32) and the training seconds."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=shape.lr,
        betas=(0.9, 0.95),
    )
    warmup = max(1, min(100, shape.steps // 10))
    tokens_per_step = sampler.batch_size * sampler.seq_len
    start = time.perf_counter()
    smoothed = None
    for step in range(shape.steps):
        lr = lr_at(step, shape.steps, shape.lr, warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = sampler.next_batch()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        smoothed = loss.item() if smoothed is None else 0.9 * smoothed + 0.1 * loss.item()
        if step % 10 == 0 or step == shape.steps - 1:
            elapsed = time.perf_counter() - start
            rate = (step + 1) * tokens_per_step / elapsed
            eta = (shape.steps - step - 1) * elapsed / (step + 1)
            print(
                f"[{name}] step {step + 1}/{shape.steps} loss {loss.item():.3f} (avg {smoothed:.3f}) "
                f"lr {lr:.2e} {rate:.0f} tok/s elapsed {elapsed:.0f}s eta {eta:.0f}s",
                flush=True,
            )
    return model, time.perf_counter() - start


def save_model(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Write config.json, generation_config.json, bf16 model.safetensors and the tokenizer files."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    eos_ids = model.config.eos_token_id
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id, eos_token_id=eos_ids, pad_token_id=model.config.pad_token_id
    )
    model.to(torch.bfloat16).save_pretrained(str(folder), safe_serialization=True)
    save_tokenizer(tokenizer, folder)


def evaluate(
    name: str, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, windows: torch.Tensor,
    seconds: float, steps: int, tokens_per_step: int, sample_tokens: int,
) -> ModelResult:
    """Held-out loss of the shipped (bf16-rounded) weights and greedy samples, computed in fp32."""
    model = model.to(torch.bfloat16).to(torch.float32)  # exactly the shipped weights, fast fp32 matmuls
    loss = heldout_loss(model, windows)
    print(f"[{name}] held-out loss {loss:.3f} (perplexity {perplexity(loss):.1f})", flush=True)
    samples = [(p, greedy_text(model, tokenizer, p, sample_tokens)[0]) for p in SAMPLE_PROMPTS]
    chat_prompt = tokenizer.apply_chat_template(CHAT_PROMPT, tokenize=False, add_generation_prompt=True)
    chat_text, ended = greedy_text(model, tokenizer, chat_prompt, sample_tokens)
    return ModelResult(
        name=name, parameters=sum(p.numel() for p in model.parameters()), config=model.config,
        steps=steps, tokens_seen=steps * tokens_per_step, train_seconds=seconds, heldout_loss=loss,
        samples=samples, chat_prompt=chat_prompt, chat_answer=chat_text, chat_ended=ended,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few steps on a small corpus (smoke test)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: runtime/demo)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--chat-fraction", type=float, default=0.15)
    parser.add_argument("--target-steps", type=int, default=None, help="override the target's step count")
    parser.add_argument("--draft-steps", type=int, default=None, help="override the draft's step count")
    # Off by default: bf16 autocast only pays on CPUs with AMX/AVX512-BF16; without them it is far slower.
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast for training matmuls")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = args.out or (Path("/tmp/demo_quick") if args.quick else PACKAGE_DIR)
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    run_start = time.perf_counter()

    corpus = load_corpus(max_files=60 if args.quick else None)
    train_texts, held_texts = list(corpus.train.values()), list(corpus.held_out.values())
    print(f"corpus: {len(train_texts)} train files, {len(held_texts)} held-out files, chars {corpus.num_chars()}",
          flush=True)
    tokenizer = train_tokenizer(train_texts, args.vocab_size)
    print(f"tokenizer: {len(tokenizer)} tokens", flush=True)

    train_ids = code_stream(tokenizer, train_texts)
    held_ids = code_stream(tokenizer, held_texts)
    chat_ids, chat_starts = chat_stream(tokenizer, train_texts, 200 if args.quick else 6000, args.seq_len, args.seed)
    print(f"tokens: train {len(train_ids)}, held-out {len(held_ids)}, chat {len(chat_ids)} "
          f"({len(chat_starts)} conversations)", flush=True)
    windows = eval_windows(held_ids, args.seq_len, 8 if args.quick else 128)

    bos = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    eos_ids = [bos, tokenizer.convert_tokens_to_ids(IM_END)]
    target_shape, draft_shape = TARGET, DRAFT
    if args.quick:
        target_shape = ModelShape(**{**TARGET.__dict__, "steps": 3})
        draft_shape = ModelShape(**{**DRAFT.__dict__, "steps": 3})
    if args.target_steps:
        target_shape = ModelShape(**{**target_shape.__dict__, "steps": args.target_steps})
    if args.draft_steps:
        draft_shape = ModelShape(**{**draft_shape.__dict__, "steps": args.draft_steps})

    results = []
    for name, shape in (("target", target_shape), ("draft", draft_shape)):
        # Both models see the same batch sequence, so they differ only in size.
        sampler = BatchSampler(train_ids, chat_ids, chat_starts, args.batch_size, args.seq_len,
                               args.chat_fraction, args.seed)
        config = llama_config(shape, len(tokenizer), bos, eos_ids)
        model, seconds = train_model(name, config, shape, sampler, args.seed, args.bf16)
        save_model(model, tokenizer, out / ("model" if name == "target" else "draft"))
        results.append(evaluate(name, model, tokenizer, windows, seconds, shape.steps,
                                args.batch_size * args.seq_len, 20 if args.quick else 80))

    info = RunInfo(
        command="python -m tools.demo_training.train" + (" " + " ".join(sys.argv[1:]) if argv is None and sys.argv[1:] else ""),
        args=vars(args), corpus_root=corpus.root, train_files=len(train_texts), held_out_files=len(held_texts),
        train_chars=corpus.num_chars()[0], held_out_chars=corpus.num_chars()[1], train_tokens=len(train_ids),
        held_out_tokens=len(held_ids), eval_tokens=windows[:, 1:].numel(), chat_conversations=len(chat_starts),
        unigram_loss=unigram_loss(train_ids, windows, len(tokenizer)),
        total_seconds=time.perf_counter() - run_start,
    )
    write_report(out / "TRAINING.md", info, results)
    print(f"done in {info.total_seconds:.0f}s; wrote {out}", flush=True)


if __name__ == "__main__":
    main()
