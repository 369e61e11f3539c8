"""The server's periodic sweep: what was abandoned is ended and its storage given back.

Every :data:`SWEEP_INTERVAL_S` the running server, in a thread, cancels dataset uploads
whose URLs expired a grace period ago (dropping what they received), ends eval imports
whose session expired unfinished (their run ``failed`` with the reason, their files
dropped), and deletes device-login rows past their expiry. Each pass is one short
transaction; a pass that fails is logged and the next one tries again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from osmosis_ai.platform.api.deps import Platform
from osmosis_ai.platform.api.objects import object_store
from osmosis_ai.platform.services import datasets, device, eval_results

SWEEP_INTERVAL_S = 300.0

logger = logging.getLogger("osmosis_ai.platform")


@dataclass(frozen=True)
class Swept:
    """What one pass ended."""

    uploads: int
    imports: int
    device_logins: int


def sweep(platform: Platform) -> Swept:
    """One pass, at the platform's clock."""
    store = object_store(platform)
    now = platform.now()
    with platform.transaction() as session:
        uploads = datasets.expire_stale_uploads(session, store, now)
        imports = eval_results.expire_imports(session, store, now=now)
        logins = device.delete_expired(session, now=now)
    return Swept(uploads, imports, logins)


async def sweep_forever(platform: Platform, interval_s: float) -> None:
    """Run :func:`sweep` every ``interval_s`` seconds until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval_s)
        running = loop.run_in_executor(None, sweep, platform)
        try:
            swept = await asyncio.shield(running)
        except asyncio.CancelledError:
            # Shutting down: let the pass finish before the database is closed under it.
            await asyncio.wait([running])
            raise
        except Exception:  # the next pass tries again; the server keeps serving
            logger.exception("the storage sweep failed")
            continue
        if swept.uploads or swept.imports or swept.device_logins:
            logger.info(
                "sweep: %d abandoned uploads, %d expired imports, %d device logins removed",
                swept.uploads,
                swept.imports,
                swept.device_logins,
            )
