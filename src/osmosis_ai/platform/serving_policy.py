"""``python -m osmosis_ai.platform.serving_policy DIR --name NAME [--base DIR]``: one deployed
model as an OpenAI-compatible server on 127.0.0.1 (the local policy server), started by the
platform's deployment manager (:mod:`osmosis_ai.platform.serving`).

``DIR`` is a Hugging Face model folder, or a LoRA adapter folder (``adapter_config.json``,
what LoRA training saves) that is merged into the base model ``--base`` through peft. The
first line on stdout is the server's base URL (``http://127.0.0.1:PORT/v1``) once it
listens. The server stops on SIGTERM, SIGINT, or when its stdin reaches end of file (the
platform that started it is gone). Needs the ``train`` extra (torch, transformers, peft).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from osmosis_ai.controller.policy.adapter import is_adapter, load_merged
from osmosis_ai.errors import ConfigError, MissingExtraError


def load_policy(
    model_dir: Path, *, name: str, base: Path | None, device: str, max_model_len: int | None
) -> Any:
    """The :class:`~osmosis_ai.controller.policy.engine.LocalPolicy` of ``model_dir``."""
    from osmosis_ai.controller.policy.engine import LocalPolicy

    if not is_adapter(model_dir):
        policy = LocalPolicy(model_dir, device=device, max_model_len=max_model_len)
        policy.name = name
        return policy
    if base is None:
        raise ConfigError(
            f"{model_dir} is a LoRA adapter but no base model folder was given: register the "
            "base model with osmosis platform model add NAME --path DIR"
        )
    merged, tokenizer = load_merged(
        model_dir, base=base, dtype="float32" if device == "cpu" else "auto"
    )
    return LocalPolicy.from_model(
        merged.to(device), tokenizer, name=name, max_model_len=max_model_len
    )


def _exit_when_orphaned(stop: threading.Event) -> None:
    """Stop once stdin closes: the platform that started this process has gone."""

    def watch() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        stop.set()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="osmosis-orphan-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m osmosis_ai.platform.serving_policy")
    parser.add_argument("model_dir", help="a Hugging Face model folder or a LoRA adapter folder")
    parser.add_argument("--name", required=True, help="the model name clients send")
    parser.add_argument("--base", default=None, help="the base model folder of an adapter")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args = parser.parse_args(argv)
    try:
        import uvicorn
    except ModuleNotFoundError as exc:
        raise MissingExtraError("server", "serving a deployed model", exc.name) from exc
    from osmosis_ai.controller.policy.app import create_policy_app

    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    policy = load_policy(
        Path(args.model_dir),
        name=args.name,
        base=Path(args.base) if args.base else None,
        device=args.device,
        max_model_len=args.max_model_len,
    )
    _exit_when_orphaned(threading.Event())
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections queue from now on, before uvicorn accepts them
    print(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    config = uvicorn.Config(create_policy_app(policy), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
