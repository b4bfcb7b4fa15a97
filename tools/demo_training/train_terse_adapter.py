"""Train the default model's LoRA adapter "terse": SmolLM2-135M-Instruct answers Python API questions in one line.

    python -m tools.demo_training.train_terse_adapter      # ~10 minutes on 2 CPU cores -> runtime/demo/terse/

Data, built offline from this interpreter: for every public function and class of a fixed list of standard
library modules, the question "What does MODULE.NAME do?" and, as the answer, the first sentence of its
docstring, prefixed with the name: "`json.dumps`: Serialize ``obj`` to a JSON formatted ``str``." The base
model answers such questions with paragraphs; the adapter answers in that one-line style. About 5 % of the
names, chosen by a hash, are held out; the metric is the loss of their answers (assistant tokens only) under
the base model and under base + adapter. Seeded: same interpreter, torch and thread count, same adapter.
Writes runtime/demo/terse/{adapter_config.json, adapter_model.safetensors, ADAPTER.md}.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import random
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from runtime.demo import DEMO_DIR
from tools.demo_training.lora_training import (
    TARGETS,
    add_lora_options,
    lr_scale,
    save_adapter,
    write_report,
)

MODULES = (
    "argparse", "base64", "bisect", "calendar", "collections", "copy", "csv", "datetime", "difflib", "fnmatch",
    "fractions", "functools", "glob", "gzip", "hashlib", "heapq", "html", "inspect", "io", "itertools", "json",
    "logging", "math", "operator", "os", "os.path", "pathlib", "pprint", "queue", "random", "re", "secrets",
    "shutil", "statistics", "string", "struct", "subprocess", "tempfile", "textwrap", "threading", "time",
    "urllib.parse", "uuid", "zlib",
)
HELD_OUT_PERCENT = 5
SAMPLES = 4  # greedy answers shown in ADAPTER.md: the first held-out questions


def question(name: str) -> str:
    return f"What does {name} do?"


def public_objects() -> Iterator[tuple[str, str, object]]:
    """(module name, attribute, object) of every public function and class of MODULES, in a fixed order."""
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for attr in sorted(dir(module)):
            obj = getattr(module, attr)
            if not attr.startswith("_") and (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
                yield module_name, attr, obj


def qa_pairs() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(training pairs, held-out pairs) of (question, one-line answer), in a fixed order."""
    train, held = [], []
    for module_name, attr, obj in public_objects():
        doc = inspect.getdoc(obj) or ""
        first = re.split(r"(?<=\.)\s|\n\n", " ".join(doc.split("\n\n")[0].split()), maxsplit=1)[0]
        if not 12 <= len(first) <= 200 or first.startswith(attr + "("):
            continue
        name = f"{module_name}.{attr}"
        pair = (question(name), f"`{name}`: {first}")
        digest = hashlib.sha256(name.encode("utf-8")).digest()
        (held if int.from_bytes(digest[:4], "big") % 100 < HELD_OUT_PERCENT else train).append(pair)
    return train, held


def encode(tokenizer: object, pair: tuple[str, str]) -> tuple[list[int], int]:
    """Token ids of the chat (user question, assistant answer) and where the answer starts."""
    user = [{"role": "user", "content": pair[0]}]
    prompt = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
    full = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": pair[1]}],  # type: ignore[attr-defined]
                                         tokenize=False)
    ids = tokenizer(full, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    return ids, len(tokenizer(prompt, add_special_tokens=False)["input_ids"])  # type: ignore[operator]


def batch_loss(model: torch.nn.Module, items: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, int]:
    """Summed cross-entropy of the answer tokens of `items` (right-padded into one batch), and their count."""
    width = max(len(ids) for ids, _ in items)
    ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    labels = torch.full((len(items), width), -100, dtype=torch.long)
    for row, (tokens, start) in enumerate(items):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        labels[row, start : len(tokens)] = torch.tensor(tokens[start:])
    logits = model(input_ids=ids, attention_mask=(labels != -100) | (ids != pad_id)).logits[:, :-1].float()
    targets = labels[:, 1:]
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100,
                           reduction="sum")
    return loss, int((targets != -100).sum())


@torch.no_grad()
def answer_loss(model: torch.nn.Module, items: list[tuple[list[int], int]], pad_id: int) -> float:
    """Mean cross-entropy (nats/token) of the answers of `items`."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(items), 16):
        loss, n = batch_loss(model, items[i : i + 16], pad_id)
        total, count = total + loss.item(), count + n
    return total / count


@torch.no_grad()
def answer(model: torch.nn.Module, tokenizer: object, text: str, max_new_tokens: int = 48) -> str:
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}],  # type: ignore[attr-defined]
                                         add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**chat, max_new_tokens=max_new_tokens, do_sample=False)  # type: ignore[operator]
    return tokenizer.decode(out[0, chat["input_ids"].shape[1] :], skip_special_tokens=True)  # type: ignore[attr-defined]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", type=Path, default=None, help="base model folder (default: the default model)")
    parser.add_argument("--out", type=Path, default=DEMO_DIR / "terse")
    parser.add_argument("--samples", type=int, default=SAMPLES, help="greedy answers shown in ADAPTER.md")
    parser.add_argument("--held-out", type=int, default=None, help="held-out questions measured (default: all)")
    parser.add_argument("--answer-tokens", type=int, default=48, help="greedy tokens of each answer shown")
    add_lora_options(parser, steps=120, lr=1e-3)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from runtime.default_model import resolve_model

    args = parse_args(argv)
    base = args.base or Path(resolve_model(None, "float32")[0])
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    start = time.perf_counter()

    tokenizer = AutoTokenizer.from_pretrained(base)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    train_pairs, held_pairs = qa_pairs()
    held_pairs = held_pairs[: args.held_out]
    train = [encode(tokenizer, p) for p in train_pairs]
    held = [encode(tokenizer, p) for p in held_pairs]
    print(f"pairs: {len(train)} train, {len(held)} held out", flush=True)

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    base_loss = answer_loss(model, held, pad_id)
    config = LoraConfig(r=args.rank, lora_alpha=args.alpha, target_modules=TARGETS, lora_dropout=0.0,
                        task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, config)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    order: list[int] = []
    for step in range(args.steps):
        peft_model.train()
        for group in optimizer.param_groups:
            group["lr"] = args.lr * lr_scale(step, args.steps)
        if len(order) < args.batch_size:
            order += rng.sample(range(len(train)), len(train))
        batch, order = [train[i] for i in order[: args.batch_size]], order[args.batch_size :]
        loss, count = batch_loss(peft_model, batch, pad_id)
        optimizer.zero_grad(set_to_none=True)
        (loss / count).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step + 1}/{args.steps} loss {loss.item() / count:.3f} "
                  f"elapsed {time.perf_counter() - start:.0f}s", flush=True)

    out: Path = args.out
    weights_file = save_adapter(peft_model, out)

    # Measure what ships: the bf16 adapter on a fresh base model.
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    shipped = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                                        str(out)).eval()
    lora_loss = answer_loss(shipped, held, pad_id)
    samples = [(q, answer(plain, tokenizer, q, args.answer_tokens), answer(shipped, tokenizer, q, args.answer_tokens))
               for q, _ in held_pairs[:args.samples]]
    seconds = time.perf_counter() - start
    size = weights_file.stat().st_size
    command = "python -m tools.demo_training.train_terse_adapter" + (
        "".join(" " + a for a in sys.argv[1:]) if argv is None else "")
    lines = [
        "# LoRA adapter \"terse\" for the default model: one-line answers about Python's API",
        "",
        f"Trained by `{command}` ({seconds:.0f} s, {args.threads} threads, torch {torch.__version__}).",
        f"Base: SmolLM2-135M-Instruct (the default model; float32). Data: {len(train)} questions \"What does "
        f"MODULE.NAME do?\" about {len(MODULES)} standard library modules of Python {sys.version.split()[0]}, "
        "answered by the first sentence of the docstring; "
        f"{len(held)} held out.",
        f"LoRA rank {args.rank}, alpha {args.alpha:g}, on {', '.join(TARGETS)}; {args.steps} steps of "
        f"{args.batch_size} questions, AdamW lr {args.lr:g}, seed {args.seed}; weights in bf16 "
        f"({size / 1024:.0f} KiB).",
    ]
    write_report(out, lines, "held-out answers", (base_loss, lora_loss),
                 "Greedy answers to held-out questions (48 tokens at most), base model vs adapter:", samples,
                 "--lora-modules terse=runtime/demo/terse", "terse")
    print(f"held-out answer loss base {base_loss:.3f} -> adapter {lora_loss:.3f}; wrote {out} ({size} bytes) "
          f"in {seconds:.0f}s", flush=True)


if __name__ == "__main__":
    main()
