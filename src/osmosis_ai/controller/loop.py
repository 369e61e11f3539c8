"""The event loop the controller side runs on: uvloop when installed, asyncio's otherwise.

Eval and training runs carry every rollout's HTTP both ways (dispatch, result polls or
callbacks, the policy proxy) on one loop, and uvloop's transports cost a fraction of
asyncio's per request. uvicorn's ``standard`` extra (our ``server`` extra) brings it.
"""

from __future__ import annotations

import asyncio


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new uvloop loop when uvloop is installed, else a new asyncio loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
