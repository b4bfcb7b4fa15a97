"""Settings: every option of `trtllm-gateway serve`, from env vars (TRTLLM_GATEWAY_<NAME>) and flags.

Options are generated from the dataclass fields of `Settings` (HTTP side) and `EngineConfig`
(engine side), so a field, its flag `--max-batch-size` and its env var
`TRTLLM_GATEWAY_MAX_BATCH_SIZE` always share one name. A field's help text is its trailing comment
in the source, and `# section: TITLE` lines become help groups, so documentation lives next to the field
(other comment lines are for developers and stay out of the help).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from runtime.config import EngineConfig

ENV_PREFIX = "TRTLLM_GATEWAY_"
# Probes and scrapes carry no key (Kubernetes probes cannot): readiness, liveness, metrics.
PUBLIC_PATHS = ("/health", "/metrics", "/v2/health/live", "/v2/health/ready")


@dataclass
class Settings:
    """The gateway's configuration; engine knobs live in `engine`."""

    # section: server
    host: str = "127.0.0.1"  # interface to listen on (0.0.0.0: all)
    port: int = 8000  # HTTP port (OpenAI and Triton HTTP APIs)
    api_servers: int = 1  # HTTP front-end processes sharing the port and one engine core (native backend)
    log_level: Literal["debug", "info", "warning", "error"] = "info"  # log verbosity
    log_format: Literal["text", "json"] = "text"  # json: one JSON object per line, with request ids
    log_prompts: bool = False  # log prompts and generated text (off: they may hold private data)
    drain_timeout: float = 5.0  # seconds in-flight requests may finish after SIGTERM before being aborted
    request_timeout: float | None = None  # seconds a request may run before it is aborted (none: no limit)
    read_timeout: float = 30.0  # seconds a client may take to send its headers, or stay silent mid-body; then it is cut off (408)
    cors_origins: list[str] = field(default_factory=list)  # origins allowed by CORS (* for any); empty: CORS off
    # section: security
    api_key: list[str] = field(default_factory=list)  # accepted bearer token (repeatable); none: no authentication
    api_keys_file: str | None = None  # file with one accepted bearer token per line (# comments)
    admin_api_key: list[str] = field(default_factory=list)  # bearer token required by admin routes (LoRA loading)
    public_paths: list[str] = field(default_factory=lambda: list(PUBLIC_PATHS))  # paths open without a key
    key_max_concurrency: int | None = None  # generation requests one API key may have in flight (none: no limit); over it: 429
    key_tokens_per_minute: int | None = None  # prompt + generated tokens one API key may use per minute (none: no limit); over it: 429
    # section: request limits
    max_body_bytes: int = 8 * 1024 * 1024  # largest request body; over it: 413
    max_json_depth: int = 32  # deepest nesting of the JSON body
    max_n: int = 16  # largest n (samples per prompt)
    max_stop_strings: int = 16  # most stop strings per request
    max_stop_string_length: int = 256  # longest stop string, in characters
    max_bad_words: int = 256  # most Triton bad_words per request
    max_logit_bias: int = 300  # most logit_bias entries (Triton: embedding_bias_words)
    max_messages: int = 1024  # most chat messages per request
    max_prompts: int = 256  # most prompts in one /v1/completions request or Triton batch
    # section: LoRA
    enable_lora_loading: bool = False  # allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter
    lora_root: list[str] = field(default_factory=list)  # folders run-time adapter paths must lie in (none: any)
    # section: Responses API
    responses_store_size: int = 1000  # most responses kept for GET /v1/responses/{id} and previous_response_id; the oldest go first (0: none)
    responses_store_ttl: float | None = 3600.0  # seconds a stored response is kept (none: until the size limit drops it)
    # section: Triton
    triton_model_repo: str | None = None  # Triton TensorRT-LLM model repository: engine settings from its config.pbtxt (flags win)
    exclude_input_in_output: bool = False  # Triton generate: answer without the prompt unless a request says otherwise
    metrics_port: int | None = None  # also serve /metrics on this port (Triton used 8002)
    grpc_port: int | None = 8001  # KServe v2 gRPC (Triton's port 8001; tritonclient.grpc); none: no gRPC
    engine: EngineConfig = field(default_factory=EngineConfig)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from TRTLLM_GATEWAY_* variables (defaults for the rest)."""
        return settings_from(env_values(os.environ if environ is None else environ))

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True)
class Option:
    """One settings field as a command-line flag and an environment variable."""

    name: str  # field name, e.g. "max_batch_size"
    owner: type  # Settings or EngineConfig
    hint: Any  # resolved type annotation
    default: Any
    help: str
    group: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def base(self) -> Any:
        """The annotation without `| None`."""
        args = [a for a in typing.get_args(self.hint) if a is not type(None)]
        if _is_union(self.hint) and len(args) == 1:
            return args[0]
        return self.hint

    @property
    def optional(self) -> bool:
        return _is_union(self.hint) and type(None) in typing.get_args(self.hint)

    @property
    def choices(self) -> tuple[Any, ...] | None:
        return typing.get_args(self.base) if typing.get_origin(self.base) is Literal else None

    def parse(self, text: str) -> Any:
        """Convert an env-var string (or one CLI word for scalars) to the field's type."""
        base, origin = self.base, typing.get_origin(self.base)
        if self.optional and text.strip().lower() in ("", "none", "null"):
            return None
        if base is bool:
            return _parse_bool(text, self.env)
        if base in (int, float, str):
            try:
                return base(text)
            except ValueError:
                raise ValueError(f"{self.env}/{self.flag}: expected {base.__name__}, got {text!r}") from None
        if origin is Literal:
            if text not in self.choices:
                raise ValueError(f"{self.env}/{self.flag}: expected one of {list(self.choices)}, got {text!r}")
            return text
        if origin is list:
            return [item.strip() for item in text.split(",") if item.strip()]
        if origin is dict:
            return self.parse_mapping(text.split(",") if typing.get_args(base)[1] is str else [text])
        raise TypeError(f"no parser for option {self.name}: {self.hint}")

    def parse_mapping(self, items: list[str]) -> dict[str, Any]:
        """dict[str, str] options take NAME=VALUE items; others one JSON object."""
        if typing.get_args(self.base)[1] is not str:
            merged: dict[str, Any] = {}
            for item in items:
                value = json.loads(item)
                if not isinstance(value, dict):
                    raise ValueError(f"{self.flag}: expected a JSON object, got {item!r}")
                merged.update(value)
            return merged
        out: dict[str, str] = {}
        for item in items:
            if not item.strip():
                continue
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"{self.env}/{self.flag}: expected NAME=VALUE, got {item!r}")
            out[key.strip()] = value.strip()
        return out


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _parse_bool(text: str, what: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{what}: expected true/false, got {text!r}")


_FIELD_LINE = re.compile(r"^\s+(\w+)\s*:[^#]*?(?:#\s*(?P<doc>.*))?$")
_SECTION_LINE = re.compile(r"^\s+#\s*section:\s*(?P<section>.+)$")


def _field_docs(cls: type) -> dict[str, tuple[str, str]]:
    """field name -> (trailing comment, section comment above it), read from the class source."""
    docs: dict[str, tuple[str, str]] = {}
    section = "engine" if cls is EngineConfig else "server"
    for line in inspect.getsource(cls).splitlines():
        if m := _SECTION_LINE.match(line):
            section = m["section"].strip()
        elif m := _FIELD_LINE.match(line):
            docs[m[1]] = ((m["doc"] or "").strip(), section)
    return docs


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def options() -> list[Option]:
    """Every option, Settings' own first, then EngineConfig's, in declaration order."""
    result: list[Option] = []
    for cls in (Settings, EngineConfig):
        hints = typing.get_type_hints(cls)
        docs = _field_docs(cls)
        for f in dataclasses.fields(cls):
            if f.name == "engine" and cls is Settings:
                continue
            doc, section = docs.get(f.name, ("", "engine"))
            if not doc:  # the help would be the option's own name
                raise RuntimeError(f"{cls.__name__}.{f.name} has no help: write it as the field's trailing comment")
            result.append(Option(f.name, cls, hints[f.name], _default(f), doc, section))
    names = [o.name for o in result]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:  # one name per option everywhere: a clash would make a flag ambiguous
        raise RuntimeError(f"options defined twice (Settings and EngineConfig): {sorted(duplicates)}")
    return result


def env_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """Typed values of every TRTLLM_GATEWAY_* variable that names an option."""
    return {o.name: o.parse(environ[o.env]) for o in options() if o.env in environ}


def settings_from(values: Mapping[str, Any]) -> Settings:
    """Settings with `values` (option name -> typed value) over the defaults."""
    unknown = set(values) - {o.name for o in options()}
    if unknown:
        raise ValueError(f"unknown options: {sorted(unknown)}")
    own = {o.name: values[o.name] for o in options() if o.owner is Settings and o.name in values}
    engine = {o.name: values[o.name] for o in options() if o.owner is EngineConfig and o.name in values}
    return Settings(**own, engine=EngineConfig(**engine))
