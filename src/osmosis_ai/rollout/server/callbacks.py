"""Posting callbacks to a 0.3.0-generation controller, with the protocol's retry policy.

Up to 5 attempts, backoff 0.5 s doubling to 8 s, 10 s per attempt; transport errors and
429/500/502/503/504 are retried, any other non-2xx answer is final. Failures are logged,
never raised into the rollout.

Without a client given, the poster makes its own on the first callback: the polling
generation never needs one, and making it (aiohttp) would delay the server's start-up.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx

from osmosis_ai.rollout.http import HttpClientOwner, async_client

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class CallbackPoster(HttpClientOwner):
    """Sends callback bodies and returns the controller's JSON acknowledgement."""

    def __init__(
        self,
        client: httpx.AsyncClient | None = None,
        *,
        max_attempts: int = 5,
        base_delay: float = 0.5,
        max_delay: float = 8.0,
        timeout: float = 10.0,
    ) -> None:
        self._init_http(client, async_client)
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.timeout = timeout

    @property
    def client(self) -> httpx.AsyncClient:
        """The given client, else our own, made now if this is the first use (in the loop)."""
        return self.http_client

    async def post(
        self, url: str, payload: dict[str, Any], bearer: str | None
    ) -> dict[str, Any] | None:
        """POST ``payload``; the parsed ack on a 2xx answer, else ``None`` (logged)."""
        headers = {"content-type": "application/json"}
        if bearer:
            headers["authorization"] = f"Bearer {bearer}"
        body = json.dumps(payload, allow_nan=False).encode()
        delay = self.base_delay
        for attempt in range(1, self.max_attempts + 1):
            try:
                response = await self.client.post(
                    url, content=body, headers=headers, timeout=self.timeout
                )
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if response.is_success:
                    return _parse_ack(response)
                if response.status_code not in RETRY_STATUSES:
                    logger.warning(
                        "callback to %s refused with HTTP %d: %s",
                        url,
                        response.status_code,
                        response.text[:500],
                    )
                    return None
                problem = f"HTTP {response.status_code}"
            if attempt == self.max_attempts:
                logger.warning("callback to %s failed after %d attempts: %s", url, attempt, problem)
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_delay)
        return None


def _parse_ack(response: httpx.Response) -> dict[str, Any]:
    if not response.content:
        return {}
    try:
        ack = response.json()
    except ValueError:
        return {}
    return ack if isinstance(ack, dict) else {}
