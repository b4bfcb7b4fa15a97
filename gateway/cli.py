"""`trtllm-gateway serve ...`: the server. (The load generator is `python -m benchmarks.serve` in a source
checkout: benchmarks are not part of the package.)

Every serve flag is generated from a Settings/EngineConfig field (gateway.settings.options), so
flag, env var and field share one name; precedence: flag > TRTLLM_GATEWAY_<NAME> > default.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gateway.settings import (
    ENV_PREFIX,
    Option,
    Settings,
    env_values,
    options,
    settings_from,
)

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from gateway.api_servers import FrontEnds
    from runtime.engine import Engine

STOP_GRACE_S = 10.0  # beyond the drain timeout, how long the other front ends (--api-servers) may take to exit


def _describe(value: Any) -> str:
    if isinstance(value, (list, dict)) and not value:
        return "empty"
    return "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _add_option(group: argparse._ArgumentGroup, opt: Option) -> None:
    help_text = f"{opt.help} [env: {opt.env}; default: {_describe(opt.default)}]"
    base = opt.base
    kwargs: dict[str, Any] = {"dest": opt.name, "default": argparse.SUPPRESS, "help": help_text}
    origin = getattr(base, "__origin__", None)
    if base is bool:
        group.add_argument(opt.flag, action=argparse.BooleanOptionalAction, **kwargs)
    elif origin is list:  # repeatable, and several values per use: --api-key a --api-key b c
        group.add_argument(opt.flag, nargs="+", action="extend", metavar="VALUE", **kwargs)
    elif origin is dict:
        meta = "NAME=VALUE" if opt.base.__args__[1] is str else "JSON"
        group.add_argument(opt.flag, nargs="+", action="extend", metavar=meta, type=str, **kwargs)
    elif opt.choices is not None:
        group.add_argument(opt.flag, choices=list(opt.choices), **kwargs)
    else:
        group.add_argument(opt.flag, type=opt.parse, metavar=opt.name.upper(), **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trtllm-gateway",
        description="OpenAI- and Triton-compatible LLM server over an in-process runtime.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{serve}")
    serve = sub.add_parser(
        "serve", help="serve a model over HTTP",
        description="Serve a model (default: SmolLM2-135M-Instruct; --model demo: the embedded demo model). "
                    f"Every option can also be set with an environment variable {ENV_PREFIX}<NAME>; a flag wins over its variable.",
    )
    groups: dict[str, argparse._ArgumentGroup] = {}
    for opt in options():
        if opt.group not in groups:
            groups[opt.group] = serve.add_argument_group(opt.group)
        _add_option(groups[opt.group], opt)
    return parser


def parse_serve_args(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    """Settings for `serve` from `argv` (without the "serve" word) over the environment."""
    ns = build_parser().parse_args(["serve", *argv])
    by_name = {o.name: o for o in options()}
    values = env_values(os.environ if environ is None else environ)
    for name, value in vars(ns).items():
        if name == "command":
            continue
        opt = by_name[name]
        if getattr(opt.base, "__origin__", None) is dict:
            value = opt.parse_mapping(value)
        values[name] = value
    if values.get("triton_model_repo"):
        values = _with_triton_repo(values)
    return settings_from(values)


def _with_triton_repo(values: dict[str, Any]) -> dict[str, Any]:
    """`values` over the settings read from --triton-model-repo (flags and env vars win over the files).

    Raises ValueError (adapters.triton.TritonRepoError) for unfilled required template values."""
    from adapters.triton import load_triton_repo

    repo = load_triton_repo(values["triton_model_repo"], cli_fields=set(values))
    if repo.warning:
        logging.getLogger("gateway.cli").warning("%s", repo.warning)
    merged = {**repo.engine, **values}
    merged.setdefault("exclude_input_in_output", repo.exclude_input_in_output)
    return merged


def serve(settings: Settings) -> int:
    """Run the server until SIGTERM/SIGINT (drained: 0); 1 if the engine failed to start or died."""
    if settings.api_servers > 1:
        if settings.engine.data_parallel_size > 1:  # each front end would start cores of its own
            logging.getLogger("gateway.cli").error("--api-servers and --data-parallel-size do not combine yet: give one")
            return 2
        from gateway.api_servers import serve_many

        return serve_many(settings)
    return run_server(settings)


def run_server(settings: Settings, engine: Engine | None = None, sock: socket.socket | None = None,
               others: FrontEnds | None = None, index: int = 0, restarts: Collector | None = None,
               serve_after: Callable[[], Awaitable[None]] | None = None) -> int:
    """One front end: the app over `engine` (None: built from the settings) on `sock` (None: bind host:port).
    Front end 0 supervises `others` (--api-servers); the others (`index` > 0) leave SIGINT to it and take
    connections once their engine has started and `serve_after()` has returned. `restarts`: the front ends' restart
    count, reported on /metrics."""
    import uvicorn

    from gateway.app import create_app
    from gateway.logs import configure_logging
    from gateway.read_timeout import http_protocol
    from gateway.shutdown import DrainingServer
    from runtime.errors import EngineError

    configure_logging(settings.log_level, settings.log_format)
    try:
        app = create_app(settings, engine)
    except (EngineError, ValueError) as exc:  # e.g. trtllm without tensorrt_llm, a missing keys file: one line
        print(f"trtllm-gateway: error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    # access_log off: gateway.middleware writes one access line per request, with its request id.
    # The graceful timeout is a backstop: in-flight work was already given --drain-timeout. The protocol
    # closes connections whose headers stall (uvicorn's keep-alive timeout covers idle ones after a response).
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            lifespan="on", log_config=None, access_log=False, timeout_graceful_shutdown=1,
                            http=http_protocol(settings.read_timeout))
    server = DrainingServer(config, app.state.drain, settings.drain_timeout,
                            on_signal=others.signal if others is not None else None,
                            ignored=(signal.SIGINT,) if index > 0 else ())
    if settings.metrics_port is not None and index == 0:  # Triton's separate metrics port (8002 there)
        from gateway.triton_metrics import start_metrics_server

        start_metrics_server(app.state.metrics.registry, settings.metrics_port, settings.host)

    def fatal(why: str | None = None) -> None:
        if why is not None:
            app.state.fatal_error = why
            logging.getLogger("gateway").error("fatal: %s; exiting", why)
        server.should_exit = True

    def ready() -> None:
        freeze_startup_objects()
        if others is not None:
            others.first_serves.mark()

    app.state.on_fatal = fatal
    app.state.on_ready = ready
    app.state.serve_after = serve_after  # (None: front end 0, which answers /health while the model loads)
    if others is not None:  # the core outlives the other front ends: they drain first
        restarts = others.restarts
        others.watch()
        app.state.before_engine_shutdown = lambda: others.wait(settings.drain_timeout + STOP_GRACE_S)
    if restarts is not None:
        app.state.metrics.registry.register(restarts)
    server.run(sockets=[sock] if sock is not None else None)
    return 1 if app.state.startup_error or app.state.fatal_error else 0


def freeze_startup_objects() -> None:
    """Exempt what is alive once the model is loaded (modules, tokenizer, engine: about 340k objects on the
    demo model) from the cyclic garbage collector. Each full collection walked them for 200-360 ms with the GIL
    held, which stalled the event loop that long under a stream of large requests."""
    gc.collect()
    gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `trtllm-gateway` console script and `python -m gateway`."""
    args = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not args or args[0] not in ("serve",):
        parser.parse_args(args)  # prints usage / help, exits
        return 2
    try:
        settings = parse_serve_args(args[1:])
    except ValueError as exc:  # a bad env var value: argparse already handled bad flags
        parser.error(str(exc))
    return serve(settings)
