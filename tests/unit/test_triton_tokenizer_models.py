"""adapters/triton/tokenizer_models.py: the backend's preprocessing and postprocessing tensors, computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from adapters.triton.metadata import model_config, model_metadata
from adapters.triton.tensors import Tensor
from adapters.triton.tokenizer_models import run_tokenizer_model
from runtime.config import EngineConfig
from runtime.errors import InvalidRequestError
from runtime.tokenizer import Tokenizer


def strings(*rows: list[str]) -> np.ndarray:
    array = np.empty((len(rows), len(rows[0])), dtype=object)
    array[:] = [[w.encode() for w in row] for row in rows]
    return array


def outputs(kind: str, tokenizer: Tokenizer, **arrays: tuple[str, np.ndarray]) -> dict[str, np.ndarray]:
    tensors = [Tensor(name, datatype, array) for name, (datatype, array) in arrays.items()]
    return {t.name: t.array for t in run_tokenizer_model(kind, tensors, tokenizer)}


def test_preprocessing_tokenizes_a_batch_as_the_backend_does(tokenizer: Tokenizer) -> None:
    eos = tokenizer.encode(tokenizer.hf.eos_token, add_special_tokens=False)[0]
    out = outputs("preprocessing", tokenizer, QUERY=("BYTES", strings(["the cat sat"], ["hi"])),
                  REQUEST_OUTPUT_LEN=("INT32", np.array([[5], [5]], dtype=np.int32)),
                  STOP_WORDS_DICT=("BYTES", strings(["the cat", "", "sat"], ["hi", "", ""])))
    long, short = tokenizer.encode("the cat sat"), tokenizer.encode("hi")
    assert out["INPUT_ID"].tolist() == [long, short + [eos] * (len(long) - len(short))]  # right-padded: pad = eos
    assert out["REQUEST_INPUT_LEN"].tolist() == [[len(long)], [len(short)]]
    assert out["OUT_END_ID"].tolist() == out["OUT_PAD_ID"].tolist() == [[eos], [eos]]
    assert out["DECODER_INPUT_ID"].tolist() == [[eos], [eos]]
    assert out["REQUEST_DECODER_INPUT_LEN"].tolist() == [[1], [1]]
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[5], [5]]
    cat, sat, hi = (tokenizer.encode(w, add_special_tokens=False) for w in ("the cat", "sat", "hi"))
    width = len(cat) + len(sat)
    assert out["STOP_WORDS_IDS"].tolist() == [
        [cat + sat, [len(cat), width] + [-1] * (width - 2)],
        [hi + [0] * (width - len(hi)), [len(hi)] + [-1] * (width - 1)]]
    assert out["BAD_WORDS_IDS"].shape == (2, 2, 0) and out["EMBEDDING_BIAS"].shape == (2, 0)
    assert {k: v.dtype for k, v in out.items()} == {**dict.fromkeys(out, np.dtype(np.int32)),
                                                    "EMBEDDING_BIAS": np.float32}


def test_preprocessing_takes_given_ids_empty_words_and_a_bias(tokenizer: Tokenizer) -> None:
    out = outputs("preprocessing", tokenizer, QUERY=("BYTES", strings(["hi"])),
                  REQUEST_OUTPUT_LEN=("INT32", np.array([[3]], dtype=np.int32)),
                  BAD_WORDS_DICT=("BYTES", strings([""])), END_ID=("INT32", np.array([[7]], dtype=np.int32)),
                  PAD_ID=("INT32", np.array([[9]], dtype=np.int32)),
                  EMBEDDING_BIAS_WORDS=("BYTES", strings(["cat"])),
                  EMBEDDING_BIAS_WEIGHTS=("FP32", np.array([[2.5]], dtype=np.float32)))
    assert out["BAD_WORDS_IDS"].tolist() == [[[0], [-1]]]  # no word: one padded slot, as the backend's script sends
    assert (out["OUT_END_ID"].tolist(), out["OUT_PAD_ID"].tolist(), out["DECODER_INPUT_ID"].tolist()) == \
        ([[7]], [[9]], [[9]])
    bias = np.zeros((1, tokenizer.vocab_size), dtype=np.float32)
    for token in tokenizer.encode("cat"):
        bias[0, token] += 2.5
    assert np.array_equal(out["EMBEDDING_BIAS"], bias)


def test_postprocessing_decodes_each_beam_to_its_length(tokenizer: Tokenizer) -> None:
    cat, dog = tokenizer.encode("the cat"), tokenizer.encode("a dog ran")
    width = max(len(cat), len(dog)) + 2
    tokens = np.array([[cat + [0] * (width - len(cat)), dog + [0] * (width - len(dog))]], dtype=np.int32)
    out = outputs("postprocessing", tokenizer, TOKENS_BATCH=("INT32", tokens),
                  SEQUENCE_LENGTH=("INT32", np.array([[len(cat), len(dog) - 1]], dtype=np.int32)))
    assert out["OUTPUT"].tolist() == [b"the cat", tokenizer.decode(dog[:-1]).encode()]


@pytest.mark.parametrize(("kind", "arrays", "param"), [
    ("preprocessing", {"QUERY": ("BYTES", strings(["hi"]))}, "REQUEST_OUTPUT_LEN"),
    ("preprocessing", {"QUERY": ("BYTES", strings(["hi"])), "REQUEST_OUTPUT_LEN": ("INT32", np.array([[1]])),
                       "IMAGE_URL": ("BYTES", strings(["x"]))}, "IMAGE_URL"),
    ("preprocessing", {"QUERY": ("INT32", np.array([[1]], dtype=np.int32))}, "QUERY"),
    ("postprocessing", {"TOKENS_BATCH": ("INT32", np.array([[[1, 2]]], dtype=np.int32)),
                        "SEQUENCE_LENGTH": ("INT32", np.array([[3]], dtype=np.int32))}, "SEQUENCE_LENGTH"),
    ("postprocessing", {"TOKENS_BATCH": ("INT32", np.array([[[10**6]]], dtype=np.int32)),
                        "SEQUENCE_LENGTH": ("INT32", np.array([[1]], dtype=np.int32))}, "TOKENS_BATCH"),
    ("postprocessing", {"text_input": ("BYTES", strings(["x"]))}, "text_input"),
])
def test_bad_tensors_are_400s_naming_the_input(tokenizer: Tokenizer, kind: str, arrays: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as err:
        outputs(kind, tokenizer, **arrays)
    assert err.value.param == param


def test_metadata_and_config_are_the_backends() -> None:
    meta = model_metadata("preprocessing", "preprocessing")
    assert meta["platform"] == "python" and {"name": "QUERY", "datatype": "BYTES", "shape": [-1, 1]} in meta["inputs"]
    assert {"name": "INPUT_ID", "datatype": "INT32", "shape": [-1, -1]} in meta["outputs"]
    assert "IMAGE_URL" not in {i["name"] for i in meta["inputs"]}
    config = model_config("postprocessing", "postprocessing", EngineConfig())
    assert config["input"][0] == {"name": "TOKENS_BATCH", "data_type": "TYPE_INT32", "dims": [-1, -1],
                                  "optional": False}
    assert config["output"] == [{"name": "OUTPUT", "data_type": "TYPE_STRING", "dims": [-1]}]
    assert config["model_transaction_policy"] == {"decoupled": False}
