"""The backend's `preprocessing` and `postprocessing` models: its ensemble's tokenizer steps, served over KServe
`infer` (HTTP and gRPC) with the tensors of tensorrtllm_backend v0.19.0's
all_models/inflight_batcher_llm/{preprocessing,postprocessing} (config.pbtxt and 1/model.py), so clients that
chain the three models themselves (tools/inflight_batcher_llm/end_to_end_test.py) run unchanged:

    preprocessing   QUERY [b, 1], REQUEST_OUTPUT_LEN [b, 1], BAD_WORDS_DICT / STOP_WORDS_DICT [b, w],
                    EMBEDDING_BIAS_WORDS [b, w] + EMBEDDING_BIAS_WEIGHTS [b, w], END_ID / PAD_ID [b, 1]
                 -> INPUT_ID [b, len] (right-padded with the pad id), REQUEST_INPUT_LEN [b, 1], DECODER_INPUT_ID
                    [b, 1] (the pad id), REQUEST_DECODER_INPUT_LEN [b, 1], BAD_WORDS_IDS / STOP_WORDS_IDS
                    [b, 2, n] (ids, then cumulative word ends padded with -1), EMBEDDING_BIAS [b, vocab or 0],
                    REQUEST_OUTPUT_LEN (as given), OUT_END_ID / OUT_PAD_ID [b, 1] (the tokenizer's, unless given)
    postprocessing  TOKENS_BATCH [b, beams, len], SEQUENCE_LENGTH [b, beams]
                 -> OUTPUT [b * beams]: each beam's first SEQUENCE_LENGTH tokens decoded, special tokens skipped

The backend's model parameters keep their defaults (add_special_tokens and skip_special_tokens true); its
multimodal inputs are accepted names whose values are refused (400), as the generating models' are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from adapters.triton.inputs import ModelKind, input_specs
from adapters.triton.tensors import Tensor
from runtime.errors import InvalidRequestError
from runtime.tokenizer import Tokenizer

TOKENIZER_MODELS: tuple[ModelKind, ...] = ("preprocessing", "postprocessing")


def run_tokenizer_model(kind: ModelKind, tensors: list[Tensor], tokenizer: Tokenizer) -> list[Tensor]:
    """The output tensors of one infer request to the `kind` model (InvalidRequestError: 400)."""
    inputs = _inputs(kind, tensors)
    return _preprocess(inputs, tokenizer) if kind == "preprocessing" else _postprocess(inputs, tokenizer)


def _inputs(kind: ModelKind, tensors: list[Tensor]) -> dict[str, np.ndarray]:
    """{name: array} of the request's tensors: known names, each once, every required one, batch first."""
    specs = {spec.name: spec for spec in input_specs(kind)}
    out: dict[str, np.ndarray] = {}
    for tensor in tensors:
        spec = specs.get(tensor.name)
        if spec is None:
            raise InvalidRequestError(f"unexpected inference input '{tensor.name}' for model '{kind}'",
                                      param=tensor.name)
        if tensor.name in out:
            raise InvalidRequestError(f"input '{tensor.name}' is given twice", param=tensor.name)
        if not spec.supported:
            raise InvalidRequestError(f"input '{tensor.name}' is not supported yet", param=tensor.name)
        if tensor.datatype != spec.datatype:
            raise InvalidRequestError(f"input '{tensor.name}' has datatype {tensor.datatype}, expected "
                                      f"{spec.datatype}", param=tensor.name)
        if tensor.array.ndim != len(spec.dims) + 1:
            raise InvalidRequestError(f"input '{tensor.name}' must have {len(spec.dims) + 1} dimensions (the batch "
                                      f"first), got shape {tensor.shape}", param=tensor.name)
        out[tensor.name] = tensor.array
    missing = [spec.name for spec in specs.values() if spec.required and spec.name not in out]
    if missing:
        raise InvalidRequestError(f"missing required input '{missing[0]}' for model '{kind}'", param=missing[0])
    batch = {array.shape[0] for array in out.values()}
    if len(batch) > 1:
        raise InvalidRequestError(f"the inputs of model '{kind}' disagree on the batch size: {sorted(batch)}")
    return out


def _texts(array: np.ndarray, name: str) -> list[list[str]]:
    """A BYTES input's rows as lists of text."""
    try:
        return [[value.decode("utf-8") for value in row] for row in array]
    except UnicodeDecodeError:
        raise InvalidRequestError(f"input '{name}' is not valid UTF-8", param=name) from None


def _token_id(tokenizer: Tokenizer, token: str | None) -> int:
    return tokenizer.encode(token or "", add_special_tokens=False)[0]


def _word_lists(tokenizer: Tokenizer, rows: list[list[str]] | None, batch: int) -> np.ndarray:
    """Words as the backend's [batch, 2, n] word lists: each row's ids flat, then the cumulative end of each word
    (empty words skipped), padded with 0 and -1 to the longest row and at least 1; no words: [batch, 2, 0]."""
    if rows is None:
        return np.empty((batch, 2, 0), dtype=np.int32)
    ids, ends = [], []
    for words in rows:
        encoded = [e for e in tokenizer.encode_many(words, add_special_tokens=False) if e] if words else []
        ids.append([t for e in encoded for t in e])
        ends.append(list(np.cumsum([len(e) for e in encoded])))
    width = max(1, max(map(len, ids)))
    padded = [[row + [0] * (width - len(row)), end + [-1] * (width - len(end))] for row, end in zip(ids, ends)]
    return np.array(padded, dtype=np.int32)


def _embedding_bias(tokenizer: Tokenizer, words: list[list[str]] | None, weights: np.ndarray | None,
                    batch: int) -> np.ndarray:
    """Per row, a vocabulary-sized bias: each word's weight added at each of its token ids (with the tokenizer's
    special tokens, as the backend encodes them); [batch, 0] without both inputs."""
    if words is None or weights is None:
        return np.empty((batch, 0), dtype=np.float32)
    bias = np.zeros((batch, tokenizer.vocab_size), dtype=np.float32)
    for row, (row_words, row_weights) in enumerate(zip(words, weights)):
        if len(row_words) != len(row_weights):
            raise InvalidRequestError("EMBEDDING_BIAS_WORDS and EMBEDDING_BIAS_WEIGHTS must have as many entries",
                                      param="EMBEDDING_BIAS_WEIGHTS")
        for ids, weight in zip(tokenizer.encode_many(row_words), row_weights):
            for token in ids:
                bias[row, token] += weight
    return bias


def _preprocess(inputs: dict[str, np.ndarray], tokenizer: Tokenizer) -> list[Tensor]:
    queries = _texts(inputs["QUERY"], "QUERY")
    batch = len(queries)
    hf = tokenizer.hf
    end_id = inputs.get("END_ID", np.full((batch, 1), _token_id(tokenizer, hf.eos_token), dtype=np.int32))
    pad_id = inputs.get("PAD_ID", np.full((batch, 1), _token_id(tokenizer, hf.pad_token or hf.eos_token),
                                          dtype=np.int32))
    prompts = tokenizer.encode_many([row[0] for row in queries], add_special_tokens=True)
    width = max(map(len, prompts))
    input_ids = np.array([ids + [int(pad_id[i][0])] * (width - len(ids)) for i, ids in enumerate(prompts)],
                         dtype=np.int32)
    words = {name: _texts(inputs[name], name) if name in inputs else None
             for name in ("BAD_WORDS_DICT", "STOP_WORDS_DICT", "EMBEDDING_BIAS_WORDS")}
    outputs: dict[str, tuple[str, Any]] = {
        "INPUT_ID": ("INT32", input_ids),
        "REQUEST_INPUT_LEN": ("INT32", np.array([[len(ids)] for ids in prompts])),
        "DECODER_INPUT_ID": ("INT32", pad_id * np.ones((batch, 1))),
        "REQUEST_DECODER_INPUT_LEN": ("INT32", np.ones((batch, 1))),
        "BAD_WORDS_IDS": ("INT32", _word_lists(tokenizer, words["BAD_WORDS_DICT"], batch)),
        "STOP_WORDS_IDS": ("INT32", _word_lists(tokenizer, words["STOP_WORDS_DICT"], batch)),
        "EMBEDDING_BIAS": ("FP32", _embedding_bias(tokenizer, words["EMBEDDING_BIAS_WORDS"],
                                                   inputs.get("EMBEDDING_BIAS_WEIGHTS"), batch)),
        "REQUEST_OUTPUT_LEN": ("INT32", inputs["REQUEST_OUTPUT_LEN"]),
        "OUT_END_ID": ("INT32", end_id),
        "OUT_PAD_ID": ("INT32", pad_id),
    }
    return [Tensor(name, datatype, np.asarray(array).astype(np.int32 if datatype == "INT32" else np.float32))
            for name, (datatype, array) in outputs.items()]


def _postprocess(inputs: dict[str, np.ndarray], tokenizer: Tokenizer) -> list[Tensor]:
    tokens, lengths = inputs["TOKENS_BATCH"], inputs["SEQUENCE_LENGTH"]
    if lengths.shape != tokens.shape[:2]:
        raise InvalidRequestError(f"SEQUENCE_LENGTH has shape {list(lengths.shape)}; TOKENS_BATCH of shape "
                                  f"{list(tokens.shape)} needs {list(tokens.shape[:2])}", param="SEQUENCE_LENGTH")
    texts = []
    for beams, beam_lengths in zip(tokens, lengths):
        for beam, length in zip(beams, beam_lengths):
            if not 0 <= length <= len(beam):
                raise InvalidRequestError(f"SEQUENCE_LENGTH {int(length)} is outside the {len(beam)} tokens given",
                                          param="SEQUENCE_LENGTH")
            if any(not 0 <= t < tokenizer.vocab_size for t in beam[:length]):
                raise InvalidRequestError("TOKENS_BATCH holds an id outside the vocabulary", param="TOKENS_BATCH")
            texts.append(tokenizer.decode(beam[:length].tolist(), skip_special_tokens=True).encode("utf-8"))
    output = np.empty(len(texts), dtype=object)
    output[:] = texts
    return [Tensor("OUTPUT", "BYTES", output)]
