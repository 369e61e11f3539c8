"""``python -m osmosis_ai.controller.policy MODEL_DIR``: serve a local checkpoint (a Hugging
Face model folder, or a LoRA adapter folder merged into ``--base`` or the base it names) as an
OpenAI-compatible server on 127.0.0.1 until SIGINT or SIGTERM.

The first line on stdout is the server's base URL (``http://127.0.0.1:PORT/v1``) once it
listens. With ``--exit-on-stdin-eof`` it also stops when its stdin reaches end of file: the
platform's deployment manager (:mod:`osmosis_ai.platform.serving`) starts it that way, so a
server outlives no platform. Needs torch and transformers (peft for an adapter).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence

from osmosis_ai.errors import MissingExtraError


def _exit_on_stdin_eof() -> None:
    """SIGTERM this process once stdin closes (whoever started it has gone)."""

    def watch() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="osmosis-orphan-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m osmosis_ai.controller.policy",
        description="Serve a Hugging Face checkpoint as an OpenAI-compatible policy server.",
    )
    parser.add_argument("model_dir", help="a Hugging Face model folder or a LoRA adapter folder")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1; 0 picks one")
    parser.add_argument("--name", default=None, help="the model name clients send")
    parser.add_argument("--base", default=None, help="the base model folder of an adapter")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default=None, help="e.g. float32, bfloat16")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument(
        "--exit-on-stdin-eof", action="store_true", help="stop when stdin reaches end of file"
    )
    args = parser.parse_args(argv)
    try:
        import uvicorn
    except ModuleNotFoundError as exc:
        raise MissingExtraError("server", "serving the local policy", exc.name) from exc
    from osmosis_ai.controller.policy.app import create_policy_app
    from osmosis_ai.controller.policy.engine import LocalPolicy, torch

    if args.threads:
        torch.set_num_threads(args.threads)
    policy = LocalPolicy(
        args.model_dir,
        base=args.base,
        device=args.device,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        seed=args.seed,
    )
    if args.name:
        policy.name = args.name
    if args.exit_on_stdin_eof:
        _exit_on_stdin_eof()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)  # connections queue from now on, before uvicorn accepts them
    print(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    config = uvicorn.Config(create_policy_app(policy), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
