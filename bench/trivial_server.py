"""The ceiling: a raw ASGI rollout server that speaks both generations and does no work.

No osmosis code and no model calls: ``POST /rollout`` answers at once. Polling body: 202
with a lease, the success result already pollable at ``GET /rollout/{id}/result``.
Callback body (names ``completion_callback_url``): 202 ``{}``, then the completion and
grader callbacks are posted right away. ``GET /health`` gives a minimal 0.3.8 body.
Run as ``python bench/trivial_server.py [--port N]`` (default $_OSMOSIS_ROLLOUT_PORT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx
import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_KEPT = 50_000  # results kept for polling; the oldest are dropped beyond this
CALLBACK_CLIENTS = 32  # small pools: httpcore's pool bookkeeping is O(connections²)
_JSON = [(b"content-type", b"application/json")]
_PROCESS_ID = uuid.uuid4().hex
_HEALTH = json.dumps(
    {
        "status": "ok",
        "concurrency": {"max_concurrent": None, "queued": 0, "running": 0},
        "instance_id": _PROCESS_ID,
        "process_id": _PROCESS_ID,
        "lifecycle": {"accepting_rollouts": True, "active_rollouts": 0},
    }
).encode()


def _sample(body: dict[str, Any]) -> dict[str, Any]:
    messages = [*body.get("initial_messages", []), {"role": "assistant", "content": "#### 42"}]
    return {
        "messages": messages,
        "label": body.get("label"),
        "reward": 1.0,
        "remove_sample": False,
        "metrics": {},
        "extra_fields": {},
    }


class TrivialServer:
    """The ASGI app."""

    def __init__(self) -> None:
        self.results: dict[str, tuple[bytes, bytes]] = {}  # id -> (lease, result body)
        self.tasks: set[asyncio.Task[None]] = set()
        # Made up front (verify=False: plain HTTP, no CA bundle to load per client).
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        self._clients = [
            httpx.AsyncClient(limits=limits, timeout=30.0, verify=False)
            for _ in range(CALLBACK_CLIENTS)
        ]

    def client(self, rollout_id: str) -> httpx.AsyncClient:
        return self._clients[hash(rollout_id) % CALLBACK_CLIENTS]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        if method == "POST" and path == "/rollout":
            await self._submit(scope, await _read(receive), send)
        elif method == "GET" and path.startswith("/rollout/") and path.endswith("/result"):
            await self._result(scope, path[len("/rollout/") : -len("/result")], send)
        elif method == "GET" and path == "/health":
            await _answer(send, 200, _HEALTH)
        else:
            await _answer(send, 404, b'{"detail":"Not Found"}')

    async def _submit(self, scope: Scope, raw: bytes, send: Send) -> None:
        try:
            body = json.loads(raw)
        except ValueError:
            await _answer(send, 422, b'{"detail":"body is not JSON"}')
            return
        rollout_id = body.get("rollout_id") or uuid.uuid4().hex
        if body.get("completion_callback_url"):
            await _answer(send, 202, b"{}")
            task = asyncio.create_task(self._callbacks(rollout_id, body))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            return
        lease = secrets.token_urlsafe(32)
        result = {
            "rollout_id": rollout_id,
            "status": "success",
            "sample": _sample(body),
            "err_message": None,
            "err_category": None,
        }
        self.results[rollout_id] = (lease.encode(), json.dumps(result).encode())
        if len(self.results) > MAX_KEPT:
            del self.results[next(iter(self.results))]
        init = {
            "rollout_id": rollout_id,
            "status": "queued",
            "polling_lease_token": lease,
            "result_wait_timeout_sec": 30.0,
            "polling_lease_timeout_sec": 120.0,
        }
        await _answer(send, 202, json.dumps(init).encode())

    async def _result(self, scope: Scope, rollout_id: str, send: Send) -> None:
        kept = self.results.get(rollout_id)
        if kept is None:
            await _answer(send, 404, b'{"detail":"unknown rollout_id"}')
            return
        lease = next((v for k, v in scope["headers"] if k == b"x-osmosis-rollout-lease"), b"")
        if lease != kept[0]:
            await _answer(send, 403, b'{"detail":"invalid polling lease"}')
            return
        await _answer(send, 200, kept[1])

    async def _callbacks(self, rollout_id: str, body: dict[str, Any]) -> None:
        key = body.get("controller_api_key")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        done = {
            "status": "success",
            "rollout_id": rollout_id,
            "extra_fields": None,
            "err_message": None,
            "err_category": None,
        }
        client = self.client(rollout_id)
        try:
            await client.post(body["completion_callback_url"], json=done, headers=headers)
            grader_url = body.get("grader_callback_url")
            if grader_url:
                graded = {
                    "status": "success",
                    "rollout_id": rollout_id,
                    "sample": _sample(body),
                    "err_message": None,
                    "err_category": None,
                }
                await client.post(grader_url, json=graded, headers=headers)
        except httpx.HTTPError as exc:
            print(f"trivial server: callback for {rollout_id} failed: {exc!r}", flush=True)


async def _read(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": _JSON})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args()
    port = args.port or int(os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000"))
    uvicorn.run(
        TrivialServer(),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=600,
    )


if __name__ == "__main__":
    main()
