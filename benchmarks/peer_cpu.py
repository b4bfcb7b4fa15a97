"""Demo model on CPU: our gateway against transformers' sequential `generate` and against
`transformers serve --continuous-batching`, on the same model and the same load, in one run.

    python -m benchmarks.peer_cpu                                   # concurrency 1,8,32; our server's defaults
    python -m benchmarks.peer_cpu --dtypes float32 --no-transformers-serve --duration 5
    python -m benchmarks.peer_cpu --append-results                  # also a dated section in RESULTS.md
    python -m benchmarks.peer_cpu --model default --peer llama.cpp  # SmolLM2 vs llama.cpp (issue 47's check)

Baselines, each measured in this run:
- `generate`: transformers' AutoModelForCausalLM.generate, one prompt at a time (greedy, exactly
  --output-tokens new tokens), in this process before any server starts.
- `transformers serve --continuous-batching` from its own virtual environment (--venv, created with
  --system-site-packages so it uses the same transformers and torch; `pip install
  'transformers[serving]'` adds FastAPI there), driven by the same load generator as our gateway.
- with `--peer llama.cpp`: llama-server (benchmarks/llama_cpp.py: built from the llama-cpp-python sdist and
  cached) on the same GGUF requantized to BF16, and on the file as shipped, each server alone, driven by the
  same load generator (greedy, ignore_eos). Every point records the server's busy cores and the load average.
Targets (issues #2, #5): at concurrency 32 >= 4x transformers serve; at concurrency 1 >= `generate`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.overhead import RESULTS_MD, _commit, _machine
from benchmarks.procs import Server, run_load_generator
from benchmarks.report import append_section, plot_throughput_by_concurrency, write_json

RESULTS_DIR = Path(__file__).parent / "results"
DEFAULTS = "defaults"  # --dtypes value: our server with no engine flags


def hf_generate_tok_s(model_path: str, dtype: str, prompts: list[list[int]], output_tokens: int) -> float:
    """Output tokens/s of sequential transformers generate (greedy, fixed output length)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).eval()
    kwargs = dict(max_new_tokens=output_tokens, min_new_tokens=output_tokens, do_sample=False)
    with torch.inference_mode():
        model.generate(torch.tensor([prompts[0]]), **kwargs)  # warm-up
        t0 = time.perf_counter()
        for ids in prompts:
            model.generate(torch.tensor([ids]), **kwargs)
        return len(prompts) * output_tokens / (time.perf_counter() - t0)


def _gateway(model: str | None, dtype: str, quantization: str, threads: int | None, args: argparse.Namespace) -> Server:
    """Our gateway; dtype DEFAULTS: with no engine flag at all, as `trtllm-gateway serve` starts (and no --model
    where the default model is measured)."""
    cmd = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", "{port}", "--grpc-port", "none",
           "--log-level", "warning"] + ([] if model is None else ["--model", model])
    if dtype != DEFAULTS:
        cmd += ["--dtype", dtype, "--max-batch-size", str(max(args.concurrency)), "--cpu-quantization", quantization]
        cmd += [] if threads is None else ["--cpu-threads", str(threads)]
    return Server("", command=cmd, ready_path="/health", env=_thread_env(args))


def _thread_env(args: argparse.Namespace) -> dict[str, str]:
    # the same intra-op thread count for every contender; on a shared 2-core machine, 2 spinning
    # OpenMP threads lose badly whenever another process takes a core
    return {"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}


def _transformers_serve(model: str, dtype: str, args: argparse.Namespace) -> Server:
    cmd = [str(Path(args.venv) / "bin" / "python"), "-m", "transformers.cli.transformers", "serve",
           "--continuous-batching", "--device", "cpu", "--dtype", dtype, "--host", "127.0.0.1", "--port", "{port}", model]
    return Server("", command=cmd, ready_path="/health", env=_thread_env(args))


def _ensure_venv(venv: str, console: Console) -> None:
    """Create the transformers-serve venv (same transformers via system site packages) if missing."""
    py = Path(venv) / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import fastapi, uvicorn"], capture_output=True).returncode == 0:
        return
    import transformers

    console.print(f"[dim]creating {venv} for transformers serve[/dim]")
    subprocess.run([sys.executable, "-m", "venv", venv, "--system-site-packages"], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", f"transformers[serving]=={transformers.__version__}"], check=True)


def _gguf(model: str | None) -> Path:
    """The GGUF file llama.cpp serves: the default model's, or the one given."""
    if model in (None, "default"):
        from runtime.default_model import default_model_file

        return default_model_file()
    if not model.endswith(".gguf"):
        raise SystemExit("--peer llama.cpp needs --model default or a .gguf file")
    return Path(model)


def _load(server: Server, label: str, model_name: str | None, c: int, args: argparse.Namespace) -> dict[str, Any]:
    """One closed-loop point. Greedy everywhere; exact output lengths via ignore_eos for our gateway and
    llama-server, via a per-request generation_config for transformers serve (it rejects unknown fields with
    422). Also the cores the server kept busy and the machine's load average, with the figure."""
    cpu, start = server.cpu_seconds(), time.monotonic()
    summary = _point(server, label, model_name, c, args)
    summary["busy_cores"] = (server.cpu_seconds() - cpu) / (time.monotonic() - start)
    summary["load_avg_1m"] = os.getloadavg()[0]
    return summary


def _point(server: Server, label: str, model_name: str | None, c: int, args: argparse.Namespace) -> dict[str, Any]:
    if label.startswith("transformers"):
        n = args.output_tokens
        gen_config = {"do_sample": False, "min_new_tokens": n, "max_new_tokens": n}
        extra = ["--no-ignore-eos", "--extra-body", json.dumps({"generation_config": json.dumps(gen_config)})]
    else:
        extra = ["--extra-body", json.dumps({"temperature": 0})]
    argv = ["--base-url", server.base_url, "--api", "completions", "--tokenizer", args.model,
            "--concurrency", str(c), "--num-prompts", "128", "--input-mean", str(args.input_tokens), "--input-std", "0",
            "--output-mean", str(args.output_tokens), "--output-std", "0", "--duration", str(args.duration),
            "--warmup", str(min(c, 8))] + (["--model", model_name] if model_name else []) + extra
    return run_load_generator(argv)["points"][0]["summary"]


def main(argv: list[str] | None = None) -> int:
    from runtime.demo import demo_model_path

    p = argparse.ArgumentParser(prog="python -m benchmarks.peer_cpu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint folder, a .gguf file, or `default` (SmolLM2-135M-Instruct); "
                                                "default: the embedded demo model")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    p.add_argument("--dtypes", default=DEFAULTS,
                   help=f"our engine's dtypes, comma list; `{DEFAULTS}`: our server with no engine flags, as users start it")
    p.add_argument("--baseline-dtype", default="float32", help="dtype of generate and transformers serve")
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--duration", type=float, default=15.0, help="seconds of load per point")
    p.add_argument("--generate-prompts", type=int, default=6, help="prompts for the sequential generate baseline")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads for all (default: torch's)")
    p.add_argument("--venv", default="/tmp/tsvenv", help="virtual environment for transformers serve")
    p.add_argument("--no-transformers-serve", dest="tserve", action="store_false")
    p.add_argument("--cpu-quantization", default="none", help="our engine's settings, comma list (none, int8, int4)")
    p.add_argument("--our-threads", default="default",
                   help="our engine's --cpu-threads, comma list (default: its own default, all cores but one)")
    p.add_argument("--peer", action="append", default=[], choices=["llama.cpp"],
                   help="also llama.cpp's llama-server on the same GGUF in BF16 and as shipped (built and cached on "
                        "first use); needs --model default (SmolLM2) or a .gguf file")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds over all servers; each point reports its median round, and every round's tok/s")
    p.add_argument("--append-results", action="store_true")
    p.add_argument("--note", default="", help="a line added to the RESULTS.md section (e.g. 'machine shared')")
    args = p.parse_args(argv)
    default_model = args.model == "default"
    from_gguf = args.peer or default_model or str(args.model).endswith(".gguf")
    gguf = _gguf(args.model) if from_gguf else None
    if gguf is not None:  # ours and transformers on the same weights, dequantized from the file
        from runtime.default_model import resolve_model

        args.model = resolve_model(str(gguf))[0]
    args.model = args.model or demo_model_path()
    command = "python -m benchmarks.peer_cpu " + shlex.join(sys.argv[1:] if argv is None else argv)
    console = Console()

    from benchmarks.dataset import load_tokenizer, synthetic_prompts

    tok = load_tokenizer(args.model)
    prompts = synthetic_prompts(tok, args.generate_prompts, args.input_tokens, 0, args.output_tokens, 0, 0)
    ids = [tok.encode(pr.text, add_special_tokens=False) for pr in prompts]
    console.print(f"[dim]transformers generate, sequential, {args.baseline_dtype}[/dim]")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    gen = hf_generate_tok_s(args.model, args.baseline_dtype, ids, args.output_tokens)

    # (server label, factory, model name as the load generator sends it)
    our_threads = [int(t) if t != "default" else None for t in args.our_threads.split(",")]
    dtypes = [d for d in args.dtypes.split(",") if d]
    served = None if default_model else args.model  # the default model is served without --model, as users get it
    targets = [("ours defaults", lambda: _gateway(served, DEFAULTS, "", None, args), None)] if DEFAULTS in dtypes else []
    targets += [(f"ours {d}" + ("" if q == "none" else f" {q}") + ("" if t is None else f" {t} threads"),
                 lambda d=d, q=q, t=t: _gateway(args.model, d, q, t, args), None)
                for d in dtypes if d != DEFAULTS for q in args.cpu_quantization.split(",") if q for t in our_threads]
    if args.tserve:
        _ensure_venv(args.venv, console)
        targets.append((f"transformers serve --cb {args.baseline_dtype}",
                        lambda: _transformers_serve(args.model, args.baseline_dtype, args), args.model))
    if gguf is not None and args.peer:
        from benchmarks.llama_cpp import ensure_built, requantized, server_command

        tools = ensure_built(console)
        threads, slots = args.threads or 2, max(args.concurrency)
        context = args.input_tokens + args.output_tokens + 64
        for label, file in (("llama.cpp BF16", requantized(tools, gguf, "BF16")), (f"llama.cpp {gguf.suffixes[-2][1:]}"
                                                                                    if len(gguf.suffixes) > 1 else "llama.cpp", gguf)):
            targets.append((label, lambda f=file: Server("", command=server_command(tools, f, threads, slots, context),
                                                         ready_path="/health"), file.name))
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {}
    failed: dict[str, str] = {}  # peers that did not start: named in the section, the others still measured
    rss: dict[str, list[int]] = {}  # each server's resident memory (its processes together) after each round
    for r in range(args.rounds):  # each server alone, in turn, every round: a drift of the box hits all of them
        for label, make, name in targets:
            if label in failed:
                continue
            server = make()
            try:
                server.wait_ready(timeout=300)
                for c in args.concurrency:
                    console.print(f"[dim]round {r + 1}/{args.rounds}, {label}: concurrency {c} ({args.duration:.0f} s)[/dim]")
                    runs.setdefault(label, {}).setdefault(c, []).append(_load(server, label, name, c, args))
                rss.setdefault(label, []).append(server.rss_bytes())  # after warm-up and every point
            except RuntimeError as exc:
                if label.startswith("ours"):
                    raise
                console.print(f"[red]{label} did not run: {exc}[/red]")
                runs.pop(label, None)
                failed[label] = str(exc)
            finally:
                server.stop()
    rows = {label: {c: _median_round(points) for c, points in by_c.items()} for label, by_c in runs.items()}
    md = _report(console, rows, gen, args, command) + "".join(f"- not measured: {k}: {v}\n" for k, v in failed.items())
    md += "".join(f"- resident memory after its points, {label} (all its processes): "
                  + " / ".join(f"{b / 2**20:.0f}" for b in values) + " MB by round\n" for label, values in rss.items())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    write_json(RESULTS_DIR / f"peer-cpu-{stamp}.json", {"command": command, "generate_tok_s": gen, "points": rows,
                                                        "rss_bytes": rss})
    png = plot_throughput_by_concurrency(
        {k: {c: s["output_token_throughput"] for c, s in v.items()} for k, v in rows.items()},
        (f"sequential generate {args.baseline_dtype}", gen), RESULTS_DIR / f"peer-cpu-{stamp}.png",
        f"{Path(args.model).name} on CPU: output tokens/s")
    md += f"\n![output tok/s by concurrency](results/{png.name})\n"
    console.print(f"plot: {png}")
    if args.append_results:
        append_section(RESULTS_MD, md, console)
    return 0


def _median_round(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median output throughput (the lower middle one of an even count), and every round's."""
    ordered = sorted(points, key=lambda s: s["output_token_throughput"])
    return {**ordered[(len(ordered) - 1) // 2], "rounds_tok_s": [s["output_token_throughput"] for s in points]}


def _report(console: Console, rows: dict[str, dict[int, dict[str, Any]]], gen: float,
            args: argparse.Namespace, command: str) -> str:
    """Print the table and verdicts; return the RESULTS.md section."""
    tserve = next((k for k in rows if k.startswith("transformers")), None)
    llama = "llama.cpp BF16" if "llama.cpp BF16" in rows else None
    cols = ["server", "concurrency", "output tok/s", "tok/s by round", "x generate", "x transformers serve", "x llama.cpp BF16",
            "TTFT p50 ms", "ITL p50 ms", "E2E p50 ms", "out tok/req", "busy cores", "load avg", "failed"]
    table_rows = []

    def versus(peer: str | None, c: int, tput: float) -> str:
        base = rows[peer][c]["output_token_throughput"] if peer else 0
        return f"{tput / base:.2f}" if base else "-"

    for label, points in rows.items():
        for c, s in points.items():
            tput = s["output_token_throughput"]
            p50 = lambda k: f"{s[k]['p50']:.1f}" if s.get(k) else "-"  # noqa: E731
            table_rows.append([label, str(c), f"{tput:.0f}", " / ".join(f"{x:.0f}" for x in s["rounds_tok_s"]),
                               f"{tput / gen:.2f}", versus(tserve, c, tput),
                               versus(llama, c, tput), p50("ttft_ms"), p50("itl_ms"), p50("e2e_ms"),
                               f"{s['mean_output_tokens']:.1f}", f"{s.get('busy_cores', 0):.2f}",
                               f"{s.get('load_avg_1m', 0):.2f}", str(s["failed"])])
    t = Table(title=f"{Path(args.model).name} on CPU; sequential generate ({args.baseline_dtype}) = {gen:.0f} output tok/s", title_justify="left")
    for col in cols:
        t.add_column(col, justify="right")
    for r in table_rows:
        t.add_row(*r)
    console.print(t)
    verdicts = []
    top, low = max(args.concurrency), min(args.concurrency)
    for label in (k for k in rows if k.startswith("ours")):
        if tserve:
            r = rows[label][top]["output_token_throughput"] / max(rows[tserve][top]["output_token_throughput"], 1e-9)
            verdicts.append(f"{label}, concurrency {top}: {r:.2f}x transformers serve ({'PASS' if r >= 4 else 'FAIL'}, target >= 4x)")
        r = rows[label][low]["output_token_throughput"] / gen
        verdicts.append(f"{label}, concurrency {low}: {r:.2f}x sequential generate ({'PASS' if r >= 1 else 'FAIL'}, target >= 1x)")
    verdicts += _llama_cpp_verdicts(rows, args.concurrency)
    for v in verdicts:
        console.print(v)
    return "\n".join([
        f"\n## {time.strftime('%Y-%m-%d %H:%M')} {Path(args.model).name} on CPU: ours vs generate vs transformers serve"
        + (" vs llama.cpp" if llama else "") + "\n",
        f"- machine: {_machine()}" + (f"; {args.note}" if args.note else ""),
        f"- commit: {_commit()}",
        f"- command: `{command}`",
        f"- torch threads per process: {args.threads or 'default'}\n"
        f"- load: closed loop, {args.duration:.0f} s per point, {args.rounds} round(s) (each point: its median round), /v1/completions streamed, prompts {args.input_tokens} tokens, "
        f"{args.output_tokens} output tokens (ignore_eos); sequential generate ({args.baseline_dtype}): "
        f"{gen:.0f} output tok/s over {args.generate_prompts} prompts\n",
        "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols),
        *("| " + " | ".join(r) + " |" for r in table_rows), "", *(f"- {v}" for v in verdicts), "",
    ])


def _llama_cpp_verdicts(rows: dict[str, dict[int, dict[str, Any]]], concurrency: list[int]) -> list[str]:
    """Issue 47's targets for each of our servers against llama.cpp's formats measured: one stream's inter-token gap
    at or below the quantized file's (Q4_1 for the default model), 16 and 32 streams at >= 1.5x the best format's
    throughput, and TTFT at 16 streams below every format's."""
    peers = [k for k in rows if k.startswith("llama.cpp")]
    quantized = next((k for k in peers if k != "llama.cpp BF16"), None)
    verdicts = []
    for label in (k for k in rows if k.startswith("ours") and peers):
        ours = rows[label]
        if 1 in concurrency and quantized:
            mine, theirs = ours[1]["itl_ms"]["p50"], rows[quantized][1]["itl_ms"]["p50"]
            verdicts.append(f"{label}, one stream: {mine:.1f} ms a token vs {quantized} {theirs:.1f} ms "
                            f"({'PASS' if mine <= theirs else 'FAIL'}, target <=)")
        for c in (c for c in (16, 32) if c in concurrency):
            best = max(peers, key=lambda k: rows[k][c]["output_token_throughput"])
            ratio = ours[c]["output_token_throughput"] / max(rows[best][c]["output_token_throughput"], 1e-9)
            verdicts.append(f"{label}, {c} streams: {ratio:.2f}x {best}, the best llama.cpp format there "
                            f"({'PASS' if ratio >= 1.5 else 'FAIL'}, target >= 1.5x)")
        if 16 in concurrency:
            mine, theirs = ours[16]["ttft_ms"]["p50"], min(rows[k][16]["ttft_ms"]["p50"] for k in peers)
            verdicts.append(f"{label}, TTFT p50 at 16 streams: {mine:.0f} ms vs llama.cpp's lowest {theirs:.0f} ms "
                            f"({'PASS' if mine < theirs else 'FAIL'}, target <)")
    return verdicts


if __name__ == "__main__":
    sys.exit(main())
