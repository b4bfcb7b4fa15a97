"""gateway.lora_routes: adapter names that already mean a model are refused (they could never be reached), and
run-time adapters load only from the LoRA roots (the cache's lora folder when none is given)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.lora_routes import allowed_path, check_adapter_names, lora_roots
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


def test_without_a_root_adapters_load_only_from_the_caches_lora_folder(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """--enable-lora-loading without --lora-root loaded adapters from any folder."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (root,) = lora_roots([])
    assert root == str(tmp_path / "cache" / "trtllm-gateway" / "lora") and Path(root).is_dir()
    (Path(root) / "sql").mkdir()
    assert allowed_path("sql", [root]) == str(Path(root) / "sql")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    refusals = []
    for path in (str(elsewhere), str(tmp_path / "missing"), "../../elsewhere", "nothing-here"):
        with pytest.raises(InvalidRequestError) as refused:
            allowed_path(path, [root])
        refusals.append(refused.value.message.replace(path, "PATH"))
    assert set(refusals) == {"lora_path 'PATH' is not a folder inside the allowed LoRA roots (--lora-root)"}
    assert lora_roots(["/given"]) == ["/given"]
