"""Train the default model's draft: a small Llama distilled from SmolLM2-135M-Instruct on its own chat answers.

    python -m tools.demo_training.train_default_draft --device cuda    # 6 minutes on an H200 -> runtime/demo/smollm2_draft/
    python -m tools.demo_training.train_default_draft --drafts 1x1536 2x768 --out /tmp/drafts   # compare shapes

Draft: the target's width, heads, vocabulary and tied embedding/head, with LAYERSxINTERMEDIATE decoder layers
initialised from target layers spread over its depth (layer 0 first, the last layer last; the MLP neurons
with the largest output norms where the draft is narrower) and its final norm. The embedding stays frozen
and equal to the target's, so only the decoder layers and the final norm are trained and shipped (int8 rows
with a scale each):
runtime/demo/__init__.py's default_draft_path adds the target's embedding when the draft is first used.
Data, built offline: chat prompts from templates (explanations, poems, facts about general topics and words of the
standard library's docstrings; questions about its functions and classes; capitals, arithmetic, small coding tasks),
answered by the target itself through its chat template: greedy, every fourth batch sampled (temperature
0.7). Prompts whose subject hashes into the held-out 3% are kept apart for the metric.
Loss: KL(target || draft) plus the cross-entropy on the target's argmax (what greedy acceptance counts),
over the answer tokens, the target's logits computed on the fly.
Metric, on the held-out prompts' greedy answers: a greedy speculative step with k drafts accepts the draft's
run of argmax agreements with the target's tokens (at most k), then the target adds one token. Teacher
forcing gives that run exactly, since the drafts that agree are the target's own tokens; DRAFT.md gives the
acceptance (accepted / proposed) and tokens a step for k = 1..6. Seeded: same torch, device and data, same draft.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import inspect
import json
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from runtime.demo import DEFAULT_DRAFT_DIR, pack_draft, unpack_draft
from tools.demo_training.lora_training import lr_scale
from tools.demo_training.train_terse_adapter import public_objects

TOPIC_TEMPLATES = ("What is {}?", "Explain {} in simple terms.", "Write a short poem about {}.",
                   "Give me three facts about {}.", "Write a short story about {}.", "Why does {} matter?",
                   "Describe {} to a child.", "Use the word \"{}\" in three sentences.")
NAME_TEMPLATES = ("What does {} do?", "Show an example of using {} in Python.", "When should I use {}?")
COUNTRIES = ("France", "Germany", "Italy", "Spain", "Japan", "China", "India", "Brazil", "Canada", "Mexico",
             "Egypt", "Kenya", "Peru", "Chile", "Norway", "Sweden", "Poland", "Greece", "Turkey", "Australia")
CODE_VERBS = ("sorts", "reverses", "counts the items of", "removes duplicates from", "finds the largest value in",
              "prints every element of")
CODE_OBJECTS = ("a list", "a string", "a dictionary", "a tuple of numbers", "a set", "a list of words")
TOPICS = ("the moon", "photosynthesis", "volcanoes", "the ocean", "bees", "gravity", "electricity", "rain",
          "the internet", "democracy", "friendship", "music", "chess", "coffee", "bread", "bicycles", "trains",
          "the heart", "sleep", "exercise", "vaccines", "dinosaurs", "the Roman Empire", "the printing press",
          "climate change", "recycling", "solar power", "money", "banks", "taxes", "elections", "libraries",
          "mathematics", "prime numbers", "fractions", "algebra", "atoms", "DNA", "black holes", "the sun",
          "mountains", "rivers", "deserts", "forests", "cats", "dogs", "elephants", "whales", "birds", "spiders",
          "computers", "databases", "encryption", "robots", "artificial intelligence", "smartphones", "email",
          "cooking", "gardening", "painting", "poetry", "football", "the Olympic Games", "space travel", "Mars",
          "earthquakes", "weather", "time zones", "calendars", "languages", "writing", "kindness", "teamwork")
HELD_OUT_PERCENT = 3
K_RANGE = range(1, 7)


def prompt_pool(seed: int = 0) -> tuple[list[str], list[str]]:
    """(training prompts, held-out prompts), each shuffled by `seed`; a subject is in one set only."""
    names, words = [], set()
    for module_name, attr, obj in public_objects():
        names.append(f"{module_name}.{attr}")
        words.update(re.findall(r"\b[a-z]{5,12}\b", inspect.getdoc(obj) or ""))
    rng = random.Random(seed)
    subjects: list[tuple[str, str]] = []  # (subject, prompt)
    for word in sorted(words):
        subjects += [(word, t.format(word)) for t in rng.sample(TOPIC_TEMPLATES, 4)]
    for name in names:
        subjects += [(name, t.format(name)) for t in rng.sample(NAME_TEMPLATES, 2)]
    subjects += [(topic, t.format(topic)) for topic in TOPICS for t in TOPIC_TEMPLATES]
    subjects += [(c, f"What is the capital of {c}?") for c in COUNTRIES]
    subjects += [(c, f"Tell me about the history of {c}.") for c in COUNTRIES]
    subjects += [(f"{v} {o}", f"Write a Python function that {v} {o}.") for v in CODE_VERBS for o in CODE_OBJECTS]
    for _ in range(1000):
        a, b = rng.randrange(2, 1000), rng.randrange(2, 100)
        op = rng.choice(("plus", "minus", "times"))
        subjects.append((f"{a} {op} {b}", f"What is {a} {op} {b}? Explain the steps."))
    rng.shuffle(subjects)
    train, held = [], []
    for subject, prompt in subjects:
        digest = hashlib.sha256(subject.encode("utf-8")).digest()
        (held if int.from_bytes(digest[:4], "big") % 100 < HELD_OUT_PERCENT else train).append(prompt)
    return train, held


def chat_ids(tokenizer: object, prompt: str) -> list[int]:
    """The prompt as the server renders it: the chat template with the generation prompt."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],  # type: ignore[attr-defined]
                                         add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]  # type: ignore[operator]


@torch.no_grad()
def answer_all(model: torch.nn.Module, tokenizer: object, prompts: list[str], max_new_tokens: int, batch_size: int,
               sample_every: int, pad: int, device: torch.device) -> list[tuple[list[int], int]]:
    """(prompt + answer ids, where the answer starts) for every prompt, answered by `model` (greedy; every
    `sample_every`-th batch sampled at temperature 0.7; 0: none). Answers end at the first end-of-turn."""
    eos = model.generation_config.eos_token_id  # type: ignore[attr-defined]
    stops = set(eos if isinstance(eos, list) else [eos])
    out: list[tuple[list[int], int]] = []
    started = time.perf_counter()
    for n, start in enumerate(range(0, len(prompts), batch_size)):
        rows = [chat_ids(tokenizer, p) for p in prompts[start : start + batch_size]]
        width = max(map(len, rows))
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)  # left-padded
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
        sampled = sample_every > 0 and n % sample_every == sample_every - 1
        gen = model.generate(input_ids=ids, attention_mask=mask,  # type: ignore[operator]
                             max_new_tokens=max_new_tokens,
                             do_sample=sampled, temperature=0.7 if sampled else None, top_p=None, top_k=None,
                             pad_token_id=pad)[:, width:].tolist()
        for r, g in zip(rows, gen):
            end = next((i + 1 for i, t in enumerate(g) if t in stops), len(g))
            out.append((r + g[:end], len(r)))
        print(f"answered {len(out)}/{len(prompts)} prompts ({'sampled' if sampled else 'greedy'}) "
              f"elapsed {time.perf_counter() - started:.0f}s", flush=True)
    return out


def build_draft(target: torch.nn.Module, layers: int, intermediate: int) -> torch.nn.Module:
    """A LAYERSxINTERMEDIATE Llama initialised from `target` (see the module docstring); embedding frozen."""
    from transformers import LlamaForCausalLM

    config = copy.deepcopy(target.config)
    config.num_hidden_layers, config.intermediate_size = layers, intermediate
    draft = LlamaForCausalLM(config).to(target.device)
    total = target.config.num_hidden_layers
    sources = [0] if layers == 1 else [round(i * (total - 1) / (layers - 1)) for i in range(layers)]
    for mine, src in zip(draft.model.layers, sources):
        state = target.model.layers[src].state_dict()
        keep = state["mlp.down_proj.weight"].norm(dim=0).topk(intermediate).indices.sort().values
        for name in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
            state[name] = state[name][keep]
        state["mlp.down_proj.weight"] = state["mlp.down_proj.weight"][:, keep]
        mine.load_state_dict(state)
    draft.model.norm.load_state_dict(target.model.norm.state_dict())
    draft.model.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
    draft.model.embed_tokens.weight.requires_grad_(False)
    draft.lm_head.weight = draft.model.embed_tokens.weight  # tied, as in the target
    return draft


def batch_tensors(items: list[tuple[list[int], int]], pad: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask, the positions whose next token is an answer token, those tokens."""
    width = max(len(ids) for ids, _ in items)
    ids = torch.full((len(items), width), pad, dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    predicts = torch.zeros((len(items), width), dtype=torch.bool)
    for row, (tokens, start) in enumerate(items):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
        predicts[row, start - 1 : len(tokens) - 1] = True
    nxt = torch.roll(ids, -1, dims=1)[predicts]
    return ids.to(device), mask.to(device), predicts.to(device), nxt.to(device)


def head_log_probs(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """Log-probabilities at the positions `at` only (the head over every position would double the memory)."""
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state[at]
    return F.log_softmax(model.lm_head(hidden).float(), dim=-1)


@torch.no_grad()
def acceptance(draft: torch.nn.Module, held: list[tuple[list[int], int]], pad: int, device: torch.device
               ) -> dict[int, tuple[float, float]]:
    """k -> (acceptance rate, tokens per step) of greedy speculation with `draft` on the target's answers `held`."""
    draft.eval()
    agree: list[list[bool]] = []
    for i in range(0, len(held), 32):
        chunk = held[i : i + 32]
        ids, mask, at, nxt = batch_tensors(chunk, pad, device)
        hits = (head_log_probs(draft, ids, mask, at).argmax(-1) == nxt).tolist()
        for tokens, start in chunk:
            n = len(tokens) - start
            agree.append(hits[1:n])  # the first answer token comes from the prefill, not from a draft
            hits = hits[n:]
    result = {}
    for k in K_RANGE:
        proposed = accepted = steps = 0
        for a in agree:
            t = 0
            while t < len(a):
                run = 0
                while run < k and t + run < len(a) and a[t + run]:
                    run += 1
                accepted, proposed, steps, t = accepted + run, proposed + k, steps + 1, t + run + 1
        result[k] = (accepted / max(1, proposed), (accepted + steps) / max(1, steps))
    return result


def save_draft(draft: torch.nn.Module, out: Path) -> Path:
    """config.json and the decoder layers + final norm in pack_draft's int8 form (no embedding: the target's is
    added at load); `draft` then holds the shipped values, so what is measured afterwards is what ships."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = pack_draft({name: t for name, t in draft.state_dict().items()
                          if not name.startswith(("model.embed_tokens", "lm_head"))})
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    draft.load_state_dict(unpack_draft(tensors, torch.float32), strict=False)
    config = copy.deepcopy(draft.config)
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out)
    return out / "model.safetensors"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=None, help="target checkpoint or .gguf (default: the default model)")
    parser.add_argument("--out", type=Path, default=DEFAULT_DRAFT_DIR)
    parser.add_argument("--drafts", nargs="+", default=["3x1536"],
                        help="LAYERSxINTERMEDIATE shapes trained side by side on the same batches; with several, "
                             "each goes to OUT/<shape>/")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--prompts", type=int, default=12000, help="training prompts (at most the pool's)")
    parser.add_argument("--held-out", type=int, default=300, help="held-out prompts for the metric")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--gen-batch-size", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--batch-size", type=int, default=64, help="answers per training step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--argmax-weight", type=float, default=1.0,
                        help="weight of the cross-entropy on the target's argmax")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads on the CPU")
    return parser.parse_args(argv)


@dataclass
class TargetData:
    """The target and its answers: what a head or draft trained on the target's own answers starts from."""

    device: torch.device
    rng: random.Random  # seeded: the training batches' order
    target: torch.nn.Module  # the HF model, float32, eval mode
    pad: int
    train: list[tuple[list[int], int]]  # (prompt + answer ids, where the answer starts)
    held: list[tuple[list[int], int]]
    answer_tokens: int  # in `train`


def target_data(args: argparse.Namespace, folder: str) -> TargetData:
    """Seed everything, load the target from `folder` and let it answer the seeded prompt pool (args: device,
    threads, seed, prompts, held_out, max_new_tokens, gen_batch_size)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
    train_prompts, held_prompts = prompt_pool(args.seed)
    train_prompts, held_prompts = train_prompts[: args.prompts], held_prompts[: args.held_out]
    print(f"target {folder}; {len(train_prompts)} training prompts, {len(held_prompts)} held out", flush=True)

    # float32 answers (the server's CPU dtype); bf16 autocast only for the training forwards
    held = answer_all(target, tokenizer, held_prompts, args.max_new_tokens, args.gen_batch_size, 0, pad, device)
    train = answer_all(target, tokenizer, train_prompts, args.max_new_tokens, args.gen_batch_size, 4, pad, device)
    answer_tokens = sum(len(t) - s for t, s in train)
    print(f"data: {answer_tokens} answer tokens to train on, elapsed {time.perf_counter() - started:.0f}s", flush=True)
    return TargetData(device, rng, target, pad, train, held, answer_tokens)


def main(argv: list[str] | None = None) -> None:
    from runtime.default_model import resolve_model
    from runtime.native.models.gguf import resolve_gguf

    args = parse_args(argv)
    started = time.perf_counter()
    folder = resolve_gguf(args.target, "float32") if args.target else resolve_model(None, "float32")[0]
    data = target_data(args, folder)
    target, pad, train, held, answer_tokens = data.target, data.pad, data.train, data.held, data.answer_tokens
    device, rng = data.device, data.rng

    shapes = [tuple(map(int, s.split("x"))) for s in args.drafts]
    drafts = [build_draft(target, layers, inter) for layers, inter in shapes]
    optimizers = [torch.optim.AdamW([p for p in d.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
                  for d in drafts]
    before = [acceptance(d, held, pad, device) for d in drafts]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    order: list[int] = []
    for step in range(args.steps):
        if len(order) < args.batch_size:
            order += rng.sample(range(len(train)), len(train))
        batch, order = [train[i] for i in order[: args.batch_size]], order[args.batch_size :]
        ids, mask, at, _ = batch_tensors(batch, pad, device)
        with torch.no_grad(), autocast:
            log_p = head_log_probs(target, ids, mask, at)
        losses = []
        for draft, optimizer in zip(drafts, optimizers):
            draft.train()
            for group in optimizer.param_groups:
                group["lr"] = args.lr * lr_scale(step, args.steps)
            with autocast:
                log_q = head_log_probs(draft, ids, mask, at)
            loss = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")  # KL(target || draft) a token
            # greedy speculation accepts only argmax agreement: a cross-entropy term on the target's argmax
            loss = loss + args.argmax_weight * F.nll_loss(log_q, log_p.argmax(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            del log_q, loss
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step + 1}/{args.steps} loss " + " ".join(f"{s}:{v:.3f}" for s, v in zip(args.drafts, losses))
                  + f" elapsed {time.perf_counter() - started:.0f}s", flush=True)

    results = {}
    for shape, draft, first in zip(args.drafts, drafts, before):
        out = args.out if len(drafts) == 1 else args.out / shape
        weights = save_draft(draft, out)
        after = acceptance(draft.float(), held, pad, device)
        results[shape] = {"bytes": weights.stat().st_size, "initial": first, "trained": after}
        write_report(out, args, shape, len(train), answer_tokens, len(held), first, after,
                     time.perf_counter() - started, argv)
        print(f"{shape}: held-out acceptance at k=4 {first[4][0]:.3f} -> {after[4][0]:.3f}, "
              f"k=2 {after[2][0]:.3f}, k=1 {after[1][0]:.3f}; wrote {out}", flush=True)
    if len(drafts) > 1:
        (args.out / "results.json").write_text(json.dumps(results, indent=1))


def write_report(out: Path, args: argparse.Namespace, shape: str, prompts: int, tokens: int, held: int,
                 before: dict[int, tuple[float, float]], after: dict[int, tuple[float, float]], seconds: float,
                 argv: list[str] | None) -> None:
    command = "python -m tools.demo_training.train_default_draft" + "".join(" " + a for a in (argv or sys.argv[1:]))
    lines = [
        f"# Draft for the default model (SmolLM2-135M-Instruct): {shape} (layers x MLP width)",
        "",
        f"Trained by `{command}` ({seconds:.0f} s on {args.device}, torch {torch.__version__}).",
        f"Data: the target's answers to {prompts} chat prompts ({tokens} answer tokens, at most "
        f"{args.max_new_tokens} each); {args.steps} steps of {args.batch_size} answers, KL(target || draft) + "
        f"{args.argmax_weight:g} x cross-entropy on its argmax, AdamW lr "
        f"{args.lr:g}, seed {args.seed}.",
        f"Held-out greedy answers to {held} prompts, teacher-forced (module docstring): acceptance = accepted / "
        "proposed drafts, tokens a step = accepted + 1.",
        "",
        "| k drafts | acceptance before training | after | tokens a step after |",
        "|---|---|---|---|",
        *(f"| {k} | {before[k][0]:.3f} | {after[k][0]:.3f} | {after[k][1]:.2f} |" for k in K_RANGE),
    ]
    (out / "DRAFT.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
