"""Train the demo LoRA adapter: the demo model (trained on stdlib *code*) learns Python's reference *prose*.

    python -m tools.demo_training.train_adapter            # ~5 minutes on 2 CPU cores -> runtime/demo/adapter/

Text: the documentation topics shipped inside the interpreter (`pydoc_data.topics`, what `help("if")`
prints): English reStructuredText prose that the demo model never saw (its corpus skips pydoc_data).
About 5 % of the topics, chosen by a hash of the topic name, are held out to measure the adapter.
Adapter: PEFT LoRA rank 8 (alpha 16) on every projection (q/k/v/o, gate/up/down), saved in bf16
(a few hundred KB). Seeded: same interpreter, torch version and thread count, same adapter.
Writes runtime/demo/adapter/{adapter_config.json, adapter_model.safetensors, ADAPTER.md}.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from runtime.demo import DEMO_DIR, demo_model_path
from tools.demo_training.dataset import BatchSampler, code_stream, eval_windows
from tools.demo_training.evaluation import greedy_text, heldout_loss
from tools.demo_training.lora_training import (
    TARGETS,
    add_lora_options,
    lr_scale,
    save_adapter,
    write_report,
)

SAMPLE_PROMPTS = ("The for statement", "Exceptions can be raised", "An assignment statement")
HELD_OUT_PERCENT = 5


def topic_texts() -> tuple[dict[str, str], dict[str, str]]:
    """(training topics, held-out topics), name -> text, sorted by name; the split hashes the name."""
    from pydoc_data.topics import topics

    train, held = {}, {}
    for name in sorted(topics):
        digest = hashlib.sha256(name.encode("utf-8")).digest()
        (held if int.from_bytes(digest[:4], "big") % 100 < HELD_OUT_PERCENT else train)[name] = topics[name]
    return train, held


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, default=None, help="base model folder (default: the demo model)")
    parser.add_argument("--out", type=Path, default=DEMO_DIR / "adapter")
    add_lora_options(parser, steps=150, lr=2e-3)
    parser.add_argument("--seq-len", type=int, default=128)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = parse_args(argv)
    base = args.base or Path(demo_model_path())
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    start = time.perf_counter()

    tokenizer = AutoTokenizer.from_pretrained(base)
    train, held = topic_texts()
    train_ids, held_ids = code_stream(tokenizer, list(train.values())), code_stream(tokenizer, list(held.values()))
    windows = eval_windows(held_ids, args.seq_len, 64)
    print(f"topics: {len(train)} train ({len(train_ids)} tokens), {len(held)} held out ({len(held_ids)} tokens)",
          flush=True)

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    base_loss = heldout_loss(model, windows)
    config = LoraConfig(r=args.rank, lora_alpha=args.alpha, target_modules=TARGETS, lora_dropout=0.0,
                        task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    sampler = BatchSampler(train_ids, torch.empty(0, dtype=torch.long), [], args.batch_size, args.seq_len, 0.0,
                           args.seed)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    peft_model.train()
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = args.lr * lr_scale(step, args.steps)
        batch = sampler.next_batch()
        logits = peft_model(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step + 1}/{args.steps} loss {loss.item():.3f} elapsed {time.perf_counter() - start:.0f}s",
                  flush=True)

    out: Path = args.out
    weights_file = save_adapter(peft_model, out)

    # Measure what ships: the bf16 adapter on a fresh base model.
    fresh = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    shipped = PeftModel.from_pretrained(fresh, str(out)).eval()
    lora_loss = heldout_loss(shipped, windows)
    samples = [(p, greedy_text(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), tokenizer, p, 30)[0],
                greedy_text(shipped, tokenizer, p, 30)[0]) for p in SAMPLE_PROMPTS]
    seconds = time.perf_counter() - start
    size = weights_file.stat().st_size
    command = "python -m tools.demo_training.train_adapter" + ("".join(" " + a for a in sys.argv[1:]) if argv is None else "")
    lines = [
        "# Demo LoRA adapter: Python reference prose",
        "",
        f"Trained by `{command}` ({seconds:.0f} s, {args.threads} threads, torch {torch.__version__}).",
        f"Base: {'the demo model' if args.base is None else base}. "
        f"Text: `pydoc_data.topics` of Python {sys.version.split()[0]} "
        f"({len(train)} topics, {len(train_ids)} tokens; {len(held)} held out, {len(held_ids)} tokens).",
        f"LoRA rank {args.rank}, alpha {args.alpha:g}, on {', '.join(TARGETS)}; {args.steps} steps of "
        f"{args.batch_size} x {args.seq_len} tokens, AdamW lr {args.lr:g}, seed {args.seed}; "
        f"weights in bf16 ({size / 1024:.0f} KiB).",
    ]
    write_report(out, lines, "held-out topics", (base_loss, lora_loss),
                 "Greedy continuations (30 tokens), base model vs adapter:",
                 [(f"`{prompt!r}`", plain, adapted) for prompt, plain, adapted in samples],
                 "--model demo --lora-modules docs=runtime/demo/adapter", "docs")
    print(f"held-out loss base {base_loss:.3f} -> adapter {lora_loss:.3f}; wrote {out} ({size} bytes) "
          f"in {seconds:.0f}s", flush=True)


if __name__ == "__main__":
    main()
