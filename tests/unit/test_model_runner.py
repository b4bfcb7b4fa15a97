"""ModelRunner: packed mixed steps (prefill, prompt chunks, decodes) give transformers' logits; steps split between
graphs (stand-ins on the CPU that keep the CUDA graphs' contracts) give the op-by-op step's results."""

from __future__ import annotations

import asyncio
import random
from itertools import accumulate
from pathlib import Path

import numpy as np
import pytest
import torch

from runtime.native.decode_rows import MAX_ROWS_PER_SEQ, DecodeOutput, fill_pending
from runtime.native.model_runner import ModelRunner
from runtime.native.models import load_model
from runtime.request import SamplingOptions
from runtime.native.sampler import Sampler, SamplingRow
from runtime.native.step_inputs import StepInput, StepInputs
from tests.engine_harness import collect, hf_greedy, request, running_engine
from tests.tiny_models import build_tiny_model

BS = 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("runner"), "llama")


@pytest.fixture(scope="module")
def hf_model(checkpoint: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()


@pytest.fixture()
def runner(checkpoint: Path) -> ModelRunner:
    r = ModelRunner(load_model(str(checkpoint), torch.float32, torch.device("cpu")), BS, Sampler(0))
    r.allocate_kv_cache(32)
    return r


def hf_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def greedy_row(prompt: list[int]) -> SamplingRow:
    return SamplingRow(SamplingOptions(temperature=0.0, logprobs=2), prompt, [], None, [0])


def test_prepare_builds_exact_metadata(runner: ModelRunner) -> None:
    inputs = [StepInput([5, 6, 7], 0, [3]), StepInput([9], 5, [1, 2])]
    ids, positions, meta = runner.prepare(inputs)
    assert ids.tolist() == [5, 6, 7, 9] and positions.tolist() == [0, 1, 2, 5]
    assert meta.query_start_loc.tolist() == [0, 3, 4]
    assert meta.context_lens.tolist() == [0, 5] and meta.seq_lens.tolist() == [3, 6]
    assert meta.block_tables.tolist() == [[3, 0], [1, 2]]
    assert meta.slot_mapping.tolist() == [12, 13, 14, 2 * BS + 1]
    assert (meta.max_query_len, meta.max_seq_len, meta.query_lens_host, meta.seq_lens_host) == (3, 6, [3, 1], [3, 6])
    assert meta.decode is None  # a prompt first: one metadata


def test_decode_rows_before_a_prompt_get_the_decode_metadata_of_a_mixed_step(runner: ModelRunner) -> None:
    """One-token rows ahead of a prompt are described apart (AttentionMetadata.decode), as a mixed graph's are: the
    attention then runs them through the decode path, not as one-row prompt tiles."""
    inputs = [StepInput([9], 5, [1, 2]), StepInput([4], 2, [6]), StepInput([5, 6, 7], 0, [3])]
    ids, positions, meta = runner.prepare(inputs)
    assert ids.tolist() == [9, 4, 5, 6, 7] and positions.tolist() == [5, 2, 0, 1, 2]
    assert meta.decode is not None and meta.decode_rows == 2
    assert meta.decode.seq_lens.tolist() == [6, 3] and meta.decode.slot_mapping.tolist() == [2 * BS + 1, 6 * BS + 2]
    assert meta.decode.block_tables.tolist() == [[1, 2], [6, 0]] and meta.decode.is_decode_only
    assert meta.query_start_loc.tolist() == [0, 3] and meta.seq_lens.tolist() == [3]
    assert meta.slot_mapping.tolist() == [12, 13, 14] and meta.step_slots().tolist() == [2 * BS + 1, 6 * BS + 2, 12, 13, 14]
    assert runner.prepare(inputs[:2])[2].decode is None  # no prompt: a decode step


def test_mixed_prefill_chunk_and_decode_steps_match_transformers(runner: ModelRunner, hf_model: torch.nn.Module) -> None:
    a = [11, 42, 7, 99, 100, 3, 250]  # 7 tokens: blocks 0, 1
    b = list(range(20, 32))  # 12 tokens in chunks of 5 and 7: blocks 2, 3, 4
    table_a, table_b = [0, 1, 5], [2, 3, 4]
    ref_a, ref_b = hf_logits(hf_model, a), hf_logits(hf_model, b)

    # step 1: A's whole prompt (sampled) and B's first chunk (not sampled yet, all logits asked)
    res = runner.execute([
        StepInput(a, 0, table_a, [greedy_row(a)], return_sample_logits=True),
        StepInput(b[:5], 0, table_b, return_all_logits=True),
    ])
    tok_a = int(ref_a[-1].argmax())
    assert res[0].token_ids == [tok_a]
    torch.testing.assert_close(res[0].sample_logits[0], ref_a[-1], rtol=1e-4, atol=1e-4)
    assert res[0].logprobs[0] == pytest.approx(float(torch.log_softmax(ref_a[-1], -1)[tok_a]), abs=1e-4)
    assert [t for t, _ in res[0].top[0]] == ref_a[-1].topk(2).indices.tolist()
    assert not res[1].token_ids and res[1].all_logits is not None
    torch.testing.assert_close(res[1].all_logits, ref_b[:5], rtol=1e-4, atol=1e-4)

    # step 2: A decodes its token; B's last chunk attends to its cached first chunk and samples
    res = runner.execute([
        StepInput([tok_a], 7, table_a, [greedy_row(a)], return_sample_logits=True),
        StepInput(b[5:], 5, table_b, [greedy_row(b)], return_all_logits=True),
    ])
    ref_a2 = hf_logits(hf_model, a + [tok_a])
    torch.testing.assert_close(res[0].sample_logits[0], ref_a2[-1], rtol=1e-4, atol=1e-4)
    assert res[0].token_ids == [int(ref_a2[-1].argmax())]
    torch.testing.assert_close(res[1].all_logits, ref_b[5:], rtol=1e-4, atol=1e-4)
    assert res[1].token_ids == [int(ref_b[-1].argmax())]


def test_several_sample_rows_share_one_logits_row(runner: ModelRunner) -> None:
    prompt = [1, 2, 3, 4, 5]
    rows = [greedy_row(prompt) for _ in range(3)]
    res = runner.execute([StepInput(prompt, 0, [0, 1], rows)])
    assert len(res[0].token_ids) == 3 and len(set(res[0].token_ids)) == 1


def test_row_argmax_is_the_argmax_of_every_asking_inputs_rows(runner: ModelRunner) -> None:
    """What speculative verification of a greedy target reads instead of its own argmax over the logits."""
    verify = StepInput([1, 2, 3, 4], 0, [0], return_all_logits=True, logits_on_device=True, return_row_argmax=True)
    plain = StepInput([5, 6, 7], 0, [1], [greedy_row([5, 6, 7])])
    other = StepInput([8, 9], 0, [2], return_all_logits=True)  # logits only: no ids
    res = runner.execute([plain, verify, other])
    assert res[1].row_argmax == res[1].all_logits.argmax(dim=-1).tolist()  # type: ignore[union-attr]
    assert len(res[1].row_argmax) == 4
    assert res[0].row_argmax is None and res[2].row_argmax is None and len(res[0].token_ids) == 1
    alone = runner.execute([StepInput([1, 2, 3, 4], 0, [3], return_all_logits=True, return_row_argmax=True)])
    assert alone[0].row_argmax == res[1].row_argmax  # a step that samples nothing brings them back too


def test_copy_blocks_copies_every_layer(runner: ModelRunner) -> None:
    for cache in runner.kv_caches:
        cache[:, 4].normal_()
    runner.copy_blocks([(4, 9)])
    for cache in runner.kv_caches:
        assert torch.equal(cache[:, 9], cache[:, 4]) and cache[:, 9].abs().sum() > 0


def test_copy_on_write_fork_continues_like_a_private_copy(runner: ModelRunner, hf_model: torch.nn.Module) -> None:
    prompt = [7, 8, 9, 10, 11, 12]  # block 0 full, block 1 half full
    res = runner.execute([StepInput(prompt, 0, [0, 1], [greedy_row(prompt)])])
    tok = res[0].token_ids[0]
    # a forked sample copies the shared partial block 1 into block 6, then both write position 6
    res = runner.execute(
        [StepInput([tok], 6, [0, 1], [greedy_row(prompt)]), StepInput([tok], 6, [0, 6], [greedy_row(prompt)])],
        copies=[(1, 6)],
    )
    expected = int(hf_logits(hf_model, prompt + [tok])[-1].argmax())
    assert res[0].token_ids == res[1].token_ids == [expected]


class OpByOp:
    """Stands in for the CUDA graphs on the CPU, with their contract: a decode graph's logits for every new
    token, a prefill graph's for each input's last token; both run the model over the runner's cache."""

    def __init__(self, runner: ModelRunner, last_only: bool, max_rows: int = 0) -> None:
        self.runner, self.last_only, self.max_rows = runner, last_only, max_rows
        self.calls: list[list[int]] = []  # the start positions of each call's inputs

    def accepts(self, inputs: StepInputs) -> bool:
        if self.last_only:
            return 0 < len(inputs) <= 8 and all(inp.prev_sample < 0 and not inp.return_all_logits for inp in inputs)
        lengths = [len(inp.token_ids) for inp in inputs]
        return bool(lengths) and max(lengths) <= MAX_ROWS_PER_SEQ and sum(lengths) <= self.max_rows

    def run(self, inputs: StepInputs, last_sampled: torch.Tensor | None = None,
            resident: object = None) -> torch.Tensor | DecodeOutput:
        self.calls.append([inp.start_pos for inp in inputs])
        ids, positions, meta = self.runner.prepare(inputs)
        fill_pending(inputs, ids, last_sampled)
        hidden = self.runner.model(ids, positions, self.runner.kv_caches, meta)
        if self.last_only:
            return self.runner.model.compute_logits(hidden[torch.tensor(list(accumulate(inputs.counts))) - 1])
        return DecodeOutput(self.runner.model.compute_logits(hidden))


class MixedOpByOp:
    """Stands in for the mixed graphs on the CPU, with their contract: one pass over decode rows and prompts; the
    logits of every decode row, padded with rows of zeros to a power of two, then each prompt's last token."""

    def __init__(self, runner: ModelRunner, max_prompt_tokens: int) -> None:
        self.runner, self.max_prompt_tokens = runner, max_prompt_tokens
        self.calls = 0

    def accepts(self, rest: StepInputs, prompts: StepInputs) -> bool:
        return (bool(rest) and 0 < len(prompts) <= 8
                and sum(len(inp.token_ids) for inp in prompts) <= self.max_prompt_tokens
                and all(inp.prev_sample < 0 and not inp.return_all_logits for inp in prompts))

    def run(self, rest: StepInputs, prompts: StepInputs, last_sampled: torch.Tensor | None,
            resident: object = None) -> tuple[torch.Tensor, int]:
        self.calls += 1
        step = StepInputs.of([*rest, *prompts])
        ids, positions, meta = self.runner.prepare(step)
        fill_pending(step, ids, last_sampled)
        logits = self.runner.model.compute_logits(self.runner.model(ids, positions, self.runner.kv_caches, meta))
        rows = sum(len(inp.token_ids) for inp in rest)
        bucket = 1 << (rows - 1).bit_length()
        last = torch.tensor(list(accumulate(step.counts)))[len(rest):] - 1
        return torch.cat((logits[:rows], logits.new_zeros((bucket - rows, logits.shape[1])), logits[last])), bucket


def test_async_engine_through_graph_stand_ins_gives_transformers_ids(checkpoint: Path,
                                                                    hf_model: torch.nn.Module) -> None:
    """With async scheduling and stand-ins for the decode, prefill and mixed graphs (their contracts, run op by op):
    a long request, then beside its decode rows (tokens still pending on the device) a short prompt alone and four
    streams of requests of different lengths. Each step kind is met whatever the machine's speed (without the long
    request, a busy box once served no short prompt beside decode rows). No step runs op by op; steps go through the
    mixed stand-in, or (prompts over its 30 tokens) a decode plus a prefill replay; every request's ids are
    transformers' greedy ones."""
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randrange(20, 41))] for _ in range(12)]
    long_prompt, long_tokens = [rng.randrange(3, 300) for _ in range(36)], 100  # alone first: the prefill stand-in
    short_prompt = [rng.randrange(3, 300) for _ in range(24)]  # then alone beside its decode rows: the mixed one

    async def main() -> tuple[list[tuple[list[int], int, list[int]]], int, set[tuple[int, int, int]]]:
        async with running_engine(checkpoint, async_scheduling=True, max_batch_size=8) as engine:
            runner = engine.runner
            runner.graphs = decode = OpByOp(runner, last_only=False, max_rows=8)  # type: ignore[assignment]
            runner.prefill_graphs = prefill = OpByOp(runner, last_only=True)  # type: ignore[assignment]
            runner.mixed_graphs = mixed = MixedOpByOp(runner, max_prompt_tokens=30)  # type: ignore[assignment]
            eager = runner.eager_steps
            kinds: set[tuple[int, int, int]] = set()  # per step: whether it ran the decode, prefill, mixed stand-in
            forward = runner._forward

            def recorded(*args: object) -> object:
                before = (len(decode.calls), len(prefill.calls), mixed.calls)
                out = forward(*args)  # type: ignore[arg-type]
                after = (len(decode.calls), len(prefill.calls), mixed.calls)
                kinds.add(tuple(int(a > b) for a, b in zip(after, before)))  # type: ignore[arg-type]
                return out
            runner._forward = recorded  # type: ignore[method-assign]

            async def stream(s: int) -> list[tuple[list[int], int, list[int]]]:
                out = []
                for j in range(3):
                    prompt, max_tokens = prompts[3 * s + j], 4 + 3 * s + 2 * j
                    got = await collect(engine, request(f"s{s}-{j}", prompt, max_tokens))
                    out.append((prompt, max_tokens, got.tokens[0]))
                return out
            decoding = asyncio.Event()
            long = asyncio.create_task(collect(engine, request("long", long_prompt, long_tokens), started=decoding))
            await decoding.wait()
            done = [(short_prompt, 5, (await collect(engine, request("short", short_prompt, 5))).tokens[0])]
            done += [r for rs in await asyncio.gather(*(stream(s) for s in range(4))) for r in rs]
            done.append((long_prompt, long_tokens, (await long).tokens[0]))
            return done, runner.eager_steps - eager, kinds

    done, eager_steps, kinds = asyncio.run(main())
    assert eager_steps == 0
    assert kinds == {(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0)}  # decode; prompts alone; mixed; decode + prefill
    for prompt, max_tokens, tokens in done:
        assert tokens == hf_greedy(hf_model, prompt, max_tokens)


def test_prompts_joining_decode_rows_replay_both_graphs(checkpoint: Path) -> None:
    """A step of decode rows, a whole prompt and a prompt's first chunk runs as a decode-graph replay plus a
    prefill-graph replay, and gives the tokens and logits of the same step run op by op; so does a step whose
    short prompt (5 tokens past a cached prefix) would not fit the decode graph beside the rows."""
    def fresh() -> ModelRunner:
        r = ModelRunner(load_model(str(checkpoint), torch.float32, torch.device("cpu")), BS, Sampler(0))
        r.allocate_kv_cache(32)
        return r

    a, b, c, d = list(range(3, 24)), list(range(40, 59)), list(range(60, 100)), list(range(110, 123))
    ta_, tb_, td_ = [0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [24, 25, 26, 27]
    first = [StepInput(a, 0, ta_, [greedy_row(a)]), StepInput(b, 0, tb_, [greedy_row(b)]),
             StepInput(d[:8], 0, td_)]  # d's first 8 tokens: its cached prefix

    def mixed(ta: int, tb: int, short: bool) -> list[StepInput]:
        step = [StepInput([ta], 21, ta_, [greedy_row(a)], return_all_logits=True),
                StepInput([tb], 19, tb_, [greedy_row(b)]),
                StepInput(c[:30], 0, [11, 12, 13, 14, 15, 16, 17, 18]),  # a chunk: nothing sampled
                StepInput(a[:20], 0, [19, 20, 21, 22, 23], [greedy_row(a[:20])], return_sample_logits=True)]
        return step + [StepInput(d[8:], 8, td_, [greedy_row(d)])] if short else step

    for short, decode_calls, prefill_calls in ((False, [[21, 19]], [[0, 0]]), (True, [[21, 19]], [[0, 0, 8]])):
        eager = fresh()
        ta, tb = (r.token_ids[0] for r in eager.execute(first)[:2])
        expected = eager.execute(mixed(ta, tb, short))
        assert eager.eager_steps == 2

        graphed = fresh()
        graphed.execute(first)
        graphed.graphs = decode = OpByOp(graphed, last_only=False, max_rows=4)  # type: ignore[assignment]
        graphed.prefill_graphs = prefill = OpByOp(graphed, last_only=True)  # type: ignore[assignment]
        got = graphed.execute(mixed(ta, tb, short))
        assert graphed.eager_steps == 1  # the first step only
        assert decode.calls == decode_calls and prefill.calls == prefill_calls
        assert [r.token_ids for r in got] == [r.token_ids for r in expected] and not got[2].token_ids
        for g, e in zip(got, expected):
            assert g.logprobs == pytest.approx(e.logprobs, abs=1e-5)
        # float32 products over 2 rows or over the whole step's 52 round apart: 1.2e-5 seen
        torch.testing.assert_close(got[0].all_logits, expected[0].all_logits, rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(got[3].sample_logits, expected[3].sample_logits, rtol=1e-5, atol=1e-5)


def test_pack_prefill_lays_out_sequences_and_tiles() -> None:
    from runtime.native.cuda.prefill_graphs import PrefillLayout, pack_prefill

    layout = PrefillLayout(rows=96, seqs=3, tiles=4, max_blocks=6)
    out = np.full(layout.size, 99, dtype=np.int64)
    used = pack_prefill([StepInput(list(range(1, 71)), 6, [4, 0, 3, 2, 1]),  # 70 over 6 cached: 2 tiles
                         StepInput([7, 8, 9], 0, [5])], 16, layout, out, bucket=80)
    # the padding rows up to the bucket's 80; the rows past it, which the bucket's graph does not read, left alone
    assert out[:73].tolist() == list(range(1, 71)) + [7, 8, 9] and set(out[73:80]) == {0} and set(out[80:96]) == {99}
    assert out[96:169].tolist() == list(range(6, 76)) + [0, 1, 2] and set(out[169:176]) == {0}
    slots = out[192:288]
    assert slots[:3].tolist() == [70, 71, 72] and slots[69] == 16 + 11  # position 75: block 4 of the table
    assert slots[70:73].tolist() == [80, 81, 82] and set(slots[73:80].tolist()) == {-1} and set(slots[80:]) == {99}
    assert out[layout.query_start: layout.context].tolist() == [0, 70, 73, 73]
    assert out[layout.context: layout.seq_lens].tolist() == [6, 0, 0]
    assert out[layout.seq_lens: layout.last].tolist() == [76, 3, 0]
    assert out[layout.last: layout.tile_seqs].tolist() == [69, 72, 0]
    # each sequence's tiles with the most keys first; the spare tile: past sequence 0's tokens
    assert out[layout.tile_seqs: layout.tables].tolist() == [0, 0, 1, 0, 64, 0, 0, 96]
    tables = out[layout.tables:].reshape(3, 6)
    assert tables[0, :5].tolist() == [4, 0, 3, 2, 1] and tables[1, 0] == 5
    assert used == layout.tables + 6 + 1  # the second table's one block, not the spare rows


def test_a_mixed_step_attends_decode_rows_and_prompts_apart(runner: ModelRunner) -> None:
    """The mixed graphs' forward pass (runtime/native/cuda/mixed_graphs.py), on the CPU: decode-shaped rows (one per
    token, AttentionMetadata.decode) then a prompt's sequence, in one pass, give the logits of the step run op by
    op over the same cache."""
    from runtime.native.cuda.graphs import row_metadata
    from runtime.native.decode_rows import pack_rows

    a, b, c = list(range(3, 12)), list(range(40, 46)), list(range(60, 73))
    runner.execute([StepInput(a, 0, [0, 1, 2]), StepInput(b, 0, [3, 4]), StepInput(c[:4], 0, [5, 6, 7, 8])])
    rest = [StepInput([12], 9, [0, 1, 2]), StepInput([46, 47], 6, [3, 4])]  # a decode row, two draft-like rows
    prompt = StepInput(c[4:], 4, [5, 6, 7, 8])  # a prompt's 9 tokens past 4 cached ones
    step = rest + [prompt]
    for inp in step:
        inp.return_all_logits = True
    eager = torch.cat([r.all_logits for r in runner.execute(step)])  # its K/V stay: the mixed pass rewrites them

    columns, tables = pack_rows(StepInputs.of(rest), BS)
    packed = torch.from_numpy(columns)
    ids, positions, meta = runner.prepare([prompt])
    meta.decode = row_metadata(packed, torch.from_numpy(tables), torch.arange(4, dtype=torch.int32), BS, 3 * BS)
    with torch.inference_mode():
        hidden = runner.model(torch.cat((packed[0], ids)), torch.cat((packed[1], positions)), runner.kv_caches, meta)
        mixed = runner.model.compute_logits(hidden)
    torch.testing.assert_close(mixed, eager, rtol=1e-5, atol=1e-5)


def test_pack_rows_reads_the_resident_tables_as_it_reads_the_lists() -> None:
    """The rows packed from the BlockManager's resident tables (runtime/native/block_tables.py) equal those built from the
    inputs' lists, for decode steps and steps of several tokens per sequence, after blocks were freed and reused."""
    from runtime.native.block_manager import BlockManager
    from runtime.native.decode_rows import pack_rows
    from runtime.native.sequence import Sequence

    rng = random.Random(3)
    bm = BlockManager(200, BS)
    seqs = []
    for i in range(12):
        seq = Sequence(f"r{i}", [rng.randrange(50) for _ in range(rng.randrange(1, 30))], 40)
        bm.append_slots(seq, seq.num_tokens)
        seq.num_computed_tokens = seq.num_tokens - 1
        seqs.append(seq)
    for seq in seqs[::3]:
        bm.free(seq)  # their rows and blocks go to the next ones
    seqs = [s for s in seqs if s.block_table] + [Sequence("new", [1, 2, 3], 8)]
    bm.append_slots(seqs[-1], 3)
    seqs[-1].num_computed_tokens = 2
    for seq in seqs:  # room for up to 4 more tokens (drafts), so some tables grow a block
        bm.append_slots(seq, 5)
    for width in (1, 4):
        inputs = StepInputs.of(
            StepInput(seq.token_ids[-1:] + [7] * rng.randrange(width), seq.num_computed_tokens, seq.block_table,
                      adapter_slot=rng.choice((-1, 2)), prev_sample=rng.choice((-1, i)), table_row=seq.table_row)
            for i, seq in enumerate(seqs))
        (want, want_tables), (got, got_tables) = pack_rows(inputs, BS), pack_rows(inputs, BS, bm.tables)
        assert got.tolist() == want.tolist()
        lengths = [len(inp.block_table) for inp in inputs for _ in inp.token_ids]
        assert [r[:n] for r, n in zip(got_tables.tolist(), lengths)] == [r[:n] for r, n in zip(want_tables.tolist(),
                                                                                              lengths)]
