"""``gaca-serve``: the command line of :mod:`gaca_agent.serving.app`."""

from __future__ import annotations

import argparse
import logging
import os

from gaca_agent.serving import app as _module
from gaca_agent.serving.app import ChatModel, make_server
from gaca_agent.serving.handler import REQUEST_TIMEOUT_S
from gaca_agent.serving.protocol import APIError


PROG = "gaca-serve"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=_module.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="hf:PATH, a model folder, or smollm2")
    parser.add_argument("--name", help="the served model name (default: as given)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("GACA_SERVE_API_KEY"),
                        help="required from clients as a Bearer token (needed off loopback; "
                             "default $GACA_SERVE_API_KEY)")
    parser.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                        help="serve a LoRA adapter as model NAME (repeatable)")
    parser.add_argument("--device", help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16",
                                                            "float16"])
    parser.add_argument("--max-queue", type=int, default=64,
                        help="requests waiting beyond this get 429")
    parser.add_argument("--max-batch", type=int, default=32, help="sampled rows per batch")
    parser.add_argument("--max-tokens", type=int, default=1024,
                        help="completion length when a request gives none")
    parser.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S, metavar="S",
                        help="close a connection that sends nothing for S seconds (an idle "
                             "keep-alive, a body that never arrives: 408)")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING"],
                        help="INFO: a line per request taken and answered (id, tokens, time)")
    return parser


def inputs(args) -> tuple[str, list[tuple[str, str]]]:
    """The model folder and the (name, path) LoRA adapters; raises InputError."""
    from gaca_agent.config.checks import InputError, check_model

    if not args.request_timeout > 0:
        raise InputError(f"--request-timeout must be > 0, got {args.request_timeout:g}")
    path = args.model[3:] if args.model.startswith("hf:") else args.model
    check_model(path)
    loras = []
    for spec in args.lora:
        name, sep, lora_path = spec.partition("=")
        if not sep or not name or not lora_path:
            raise InputError(f"--lora takes NAME=PATH, got {spec!r}")
        loras.append((name, lora_path))
    if args.model == "smollm2":
        from gaca_agent.policies.smollm2 import smollm2_path

        path = str(smollm2_path())
    return path, loras


def main(argv: list[str] | None = None) -> int:
    from gaca_agent.cli import fail
    from gaca_agent.config.checks import InputError
    from gaca_agent.runs.progress import quiet_libraries

    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(message)s")
    quiet_libraries()  # its own lines only: no "Loading weights" bar
    try:
        path, loras = inputs(args)
        model = ChatModel(path, args.name or args.model, device=args.device, dtype=args.dtype,
                          max_queue=args.max_queue, max_batch=args.max_batch,
                          max_tokens=args.max_tokens)
        for name, lora_path in loras:
            model.adapters.load(name, lora_path)
        server = make_server(model, args.host, args.port, args.api_key, args.request_timeout)
    except (InputError, ValueError, OSError, APIError) as err:
        return fail(PROG, err)
    print(f"OpenAI-compatible server on http://{args.host}:{server.server_port}/v1 "
          f"(models: {', '.join(model.adapters.names())})", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        model.close()
        server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
