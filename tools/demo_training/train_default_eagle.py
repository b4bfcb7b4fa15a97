"""Train the default model's EAGLE head (runtime/native/speculative/eagle_head.py) for SmolLM2-135M-Instruct.

    python -m tools.demo_training.train_default_eagle --device cuda    # -> runtime/demo/smollm2_eagle/

Data: the shipped draft's (train_default_draft.py: the same seeded prompt pool and held-out split, answered by the
target itself, greedy with every fourth batch sampled). The target's hidden states and logits are computed on the
fly for each batch. Loss, summed over the unrolled chain passes (eagle_head.py's docstring; pass u weighted 0.8^u):
KL(target || head) plus the cross-entropy on the target's argmax, over the answer positions.
Metric, on the held-out prompts' greedy answers: the exact chained drafts of the head from every verified index
(the unroll is the chain), so EAGLE.md gives acceptance per position (the share of steps whose draft j is
accepted, given drafts 1..j-1 were) and, for k = 1..6 drafts a step, acceptance and tokens a step.
Shipped: fc, the decoder layer and the final norm in pack_draft's int8 form; embedding and lm_head are the target's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from runtime.demo import DEFAULT_EAGLE_DIR, pack_draft, unpack_draft
from runtime.native.speculative.eagle_head import EagleHead
from tools.demo_training.lora_training import lr_scale
from tools.demo_training.train_default_draft import K_RANGE, batch_tensors, target_data

PASS_DECAY = 0.8


def head_from_target(target: torch.nn.Module) -> EagleHead:
    """A head shaped like a layer of the HF Llama `target`, initialised from its last layer and final norm,
    with fc passing the hidden state through (so the untrained head predicts what the target's next layer would)."""
    c = target.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta") or getattr(c, "rope_theta", 10000.0)
    head = EagleHead(c.hidden_size, c.num_attention_heads, c.num_key_value_heads, head_dim, c.intermediate_size,
                     c.rms_norm_eps, float(theta)).to(target.device)
    last = target.model.layers[-1]
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(head, name).weight.copy_(getattr(last.self_attn, name).weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(head, name).weight.copy_(getattr(last.mlp, name).weight)
        head.input_layernorm.copy_(last.input_layernorm.weight)
        head.post_attention_layernorm.copy_(last.post_attention_layernorm.weight)
        head.norm.copy_(target.model.norm.weight)
        hidden = c.hidden_size
        head.fc.weight.zero_()
        head.fc.weight[:, :hidden].normal_(std=0.02)  # the embedding's share starts small
        head.fc.weight[:, hidden:].copy_(torch.eye(hidden))
    return head


def target_states(target: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(final-normed hidden states [B, T, H], the embeddings of the next tokens [B, T, H]) of the HF target."""
    hidden = target.model(input_ids=ids, attention_mask=mask).last_hidden_state
    embeds = target.model.embed_tokens(torch.roll(ids, -1, dims=1))
    return hidden, embeds


def head_passes(head: EagleHead, target: torch.nn.Module, hidden: torch.Tensor, embeds: torch.Tensor,
                passes: int, at: torch.Tensor) -> list[torch.Tensor]:
    """Log-probabilities of each pass's prediction at the indices `at` (pass u at index t predicts x_{t+2})."""
    return [F.log_softmax(target.lm_head(out[at]).float(), dim=-1) for out in head.unrolled(hidden, embeds, passes)]


@torch.no_grad()
def chain_hits(head: EagleHead, target: torch.nn.Module, held: list[tuple[list[int], int]], pad: int,
               depth: int, device: torch.device) -> list[list[list[bool]]]:
    """For each held-out answer, hits[u][n]: chain step u+1 from verified index n (counted from the answer's first
    token's producer, start-1) drafts the target's token there."""
    head.eval()
    out: list[list[list[bool]]] = []
    for i in range(0, len(held), 16):
        chunk = held[i : i + 16]
        ids, mask, _, _ = batch_tensors(chunk, pad, device)
        hidden, embeds = target_states(target, ids, mask)
        outs = head.unrolled(hidden.float(), embeds.float(), depth)
        guesses = [target.lm_head(o).argmax(-1).tolist() for o in outs]  # [B][T]: pass u at t predicts x_{t+2}
        for row, (tokens, start) in enumerate(chunk):
            hits = []
            for u in range(depth):
                # chain from n = start-1 .. ; step u+1 sits at index n+u and predicts x_{n+u+2}
                row_hits = []
                for n in range(start - 1, len(tokens) - 2 - u):
                    row_hits.append(guesses[u][row][n + u] == tokens[n + u + 2])
                hits.append(row_hits)
            out.append(hits)
    return out


def acceptance(hits: list[list[list[bool]]], depth: int) -> tuple[list[float], dict[int, tuple[float, float]]]:
    """(acceptance per position 1..depth at k = depth, {k: (accepted / proposed, tokens a step)}): greedy speculation
    replayed on the answers, each step drafting k tokens from the last verified index and accepting the agreeing run."""
    per_position = [[0, 0] for _ in range(depth)]  # [accepted, reached]
    result = {}
    for k in K_RANGE:
        if k > depth:
            break
        proposed = accepted = steps = 0
        for h in hits:
            n = 0  # offset of the verified index from start-1
            while n < len(h[0]):
                run = 0
                while run < k and n < len(h[run]) and h[run][n]:
                    run += 1
                if k == depth:
                    for j in range(min(run + 1, k)):
                        per_position[j][1] += 1
                        per_position[j][0] += j < run
                accepted, proposed, steps, n = accepted + run, proposed + k, steps + 1, n + run + 1
        result[k] = (accepted / max(1, proposed), (accepted + steps) / max(1, steps))
    return [a / max(1, r) for a, r in per_position], result


def save_head(head: EagleHead, out: Path) -> Path:
    """config.json and the head's weights in pack_draft's int8 form; `head` then holds the shipped values."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = pack_draft(head.state_dict())
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    head.load_state_dict(unpack_draft(tensors, torch.float32))
    (out / "config.json").write_text(json.dumps(head.config(), indent=1) + "\n")
    return out / "model.safetensors"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_EAGLE_DIR)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--prompts", type=int, default=12000, help="training prompts (at most the pool's)")
    parser.add_argument("--held-out", type=int, default=300, help="held-out prompts for the metric")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--gen-batch-size", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--batch-size", type=int, default=64, help="answers per training step")
    parser.add_argument("--passes", type=int, default=3, help="chain steps unrolled in training")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads on the CPU")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    from runtime.default_model import resolve_model

    args = parse_args(argv)
    started = time.perf_counter()
    data = target_data(args, resolve_model(None, "float32")[0])
    target, pad, train, held, device, rng = data.target, data.pad, data.train, data.held, data.device, data.rng
    target.requires_grad_(False)

    depth = max(K_RANGE)
    head = head_from_target(target)
    with torch.no_grad():
        before = acceptance(chain_hits(head, target, held, pad, depth, device), depth)
    optimizer = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    order: list[int] = []
    for step in range(args.steps):
        if len(order) < args.batch_size:
            order += rng.sample(range(len(train)), len(train))
        batch, order = [train[i] for i in order[: args.batch_size]], order[args.batch_size :]
        ids, mask, at, _ = batch_tensors(batch, pad, device)
        # the head at t predicts x_{t+2}, what the target predicts at t+1: positions t with t+1 an answer position
        at_head = torch.zeros_like(at)
        at_head[:, :-1] = at[:, 1:]
        with torch.no_grad(), autocast:
            hidden, embeds = target_states(target, ids, mask)
            log_p = F.log_softmax(target.lm_head(hidden[:, 1:][at_head[:, :-1]]).float(), dim=-1)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * lr_scale(step, args.steps)
        head.train()
        with autocast:
            passes = head_passes(head, target, hidden, embeds, args.passes, at_head)
        argmax = log_p.argmax(-1)
        loss = sum(PASS_DECAY**u * (F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
                                    + F.nll_loss(log_q, argmax)) for u, log_q in enumerate(passes))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[union-attr]
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step + 1}/{args.steps} loss {loss.item():.3f} elapsed {time.perf_counter() - started:.0f}s",
                  flush=True)

    weights = save_head(head.float(), args.out)
    with torch.no_grad():
        after = acceptance(chain_hits(head, target, held, pad, depth, device), depth)
    write_report(args.out, args, len(train), data.answer_tokens, len(held), before, after,
                 time.perf_counter() - started, weights.stat().st_size, argv)
    print(f"held-out acceptance per position {' '.join(f'{a:.3f}' for a in after[0])}; wrote {args.out}", flush=True)


def write_report(out: Path, args: argparse.Namespace, prompts: int, tokens: int, held: int,
                 before: tuple[list[float], dict[int, tuple[float, float]]],
                 after: tuple[list[float], dict[int, tuple[float, float]]], seconds: float, size: int,
                 argv: list[str] | None) -> None:
    command = "python -m tools.demo_training.train_default_eagle" + "".join(" " + a for a in (argv or sys.argv[1:]))
    lines = [
        "# EAGLE head for the default model (SmolLM2-135M-Instruct)",
        "",
        (f"Trained by `{command}` ({seconds:.0f} s on {args.device}, torch {torch.__version__}); "
         f"{size} bytes shipped."),
        (f"Data: the target's answers to {prompts} chat prompts ({tokens} answer tokens, at most "
         f"{args.max_new_tokens} each); {args.steps} steps of {args.batch_size} answers, {args.passes} chain steps "
         f"unrolled, KL(target || head) + cross-entropy on its argmax, AdamW lr {args.lr:g}, seed {args.seed}."),
        f"Held-out greedy answers to {held} prompts, exact chained drafts (module docstring).",
        "",
        f"Acceptance per position at k = {len(after[0])} (draft j accepted, given drafts 1..j-1 were):",
        "",
        "| position | before training | after |",
        "|---|---|---|",
        *(f"| {j + 1} | {b:.3f} | {a:.3f} |" for j, (b, a) in enumerate(zip(before[0], after[0]))),
        "",
        "| k drafts | acceptance before training | after | tokens a step after |",
        "|---|---|---|---|",
        *(f"| {k} | {before[1][k][0]:.3f} | {after[1][k][0]:.3f} | {after[1][k][1]:.2f} |" for k in after[1]),
    ]
    (out / "EAGLE.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
