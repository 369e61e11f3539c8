"""``python -m osmosis_ai.controller.policy MODEL_DIR --port N``: serve a local checkpoint as
an OpenAI-compatible server on 127.0.0.1 until SIGINT or SIGTERM; prints its base URL."""

from __future__ import annotations

import argparse
import socket
from collections.abc import Sequence

from osmosis_ai.errors import MissingExtraError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m osmosis_ai.controller.policy",
        description="Serve a Hugging Face checkpoint as an OpenAI-compatible policy server.",
    )
    parser.add_argument("model_dir", help="a Hugging Face-format model directory")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1; 0 picks one")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--dtype", default=None, help="e.g. float32, bfloat16")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
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
        device=args.device,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        seed=args.seed,
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    print(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    config = uvicorn.Config(create_policy_app(policy), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
