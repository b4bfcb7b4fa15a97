"""gateway.lora_routes: adapter names that already mean a model are refused (they could never be reached)."""

from __future__ import annotations

import pytest

from gateway.lora_routes import check_adapter_names
from runtime.errors import InvalidRequestError


@pytest.mark.parametrize("name", ["tiny", "ensemble", "tensorrt_llm", "tensorrt_llm_bls"])
def test_model_names_are_not_adapter_names(name: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        check_adapter_names(["sql", name], "tiny")
    assert info.value.param == "lora_name"
    assert info.value.message == (
        f"lora_name: the adapter name '{name}' is already a model name of this server (the served model 'tiny' "
        "and the Triton models ensemble, tensorrt_llm_bls, tensorrt_llm); choose another name")


def test_start_up_wording_names_the_flag_and_other_names_pass() -> None:
    with pytest.raises(InvalidRequestError, match=r"^--lora-modules: the adapter name 'ensemble' is already"):
        check_adapter_names({"sql": "/a", "ensemble": "/b"}, "tiny", "--lora-modules")
    check_adapter_names(["sql", "Ensemble", "tiny2", "lora_task_1"], "tiny")
