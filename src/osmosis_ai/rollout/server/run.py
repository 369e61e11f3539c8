"""The entrypoint convention: serve on ``$_OSMOSIS_ROLLOUT_PORT`` (default 8000)."""

from __future__ import annotations

import gc
import os
from typing import Any, cast

from osmosis_ai.rollout.server.app import ServerOptionError
from osmosis_ai.rollout.server.workers import resolve_workers, serve_workers

PORT_ENV = "_OSMOSIS_ROLLOUT_PORT"
HOST_ENV = "OSMOSIS_ROLLOUT_HOST"
DEFAULT_PORT = 8000
DEFAULT_HOST = "127.0.0.1"
YOUNG_GC_THRESHOLD = 10_000
"""Container allocations (net of frees) between young-generation collections when serving."""
_INTERPRETER_YOUNG_THRESHOLDS = frozenset({700, 2000})  # 3.11-3.12, 3.13


def resolve_port(port: int | None = None) -> int:
    """``port``, else ``$_OSMOSIS_ROLLOUT_PORT``, else 8000 (:class:`ServerOptionError` when
    the one chosen is not a port number)."""
    if port is not None:
        value = cast(object, port)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
            raise ServerOptionError(f"port={port!r} is not a port number: use 0-65535")
        return value
    raw = os.environ.get(PORT_ENV, "")
    if not raw:
        return DEFAULT_PORT
    try:
        number = int(raw)
    except ValueError:
        raise ServerOptionError(f"{PORT_ENV}={raw!r} is not a port number") from None
    if not 0 <= number <= 65535:
        raise ServerOptionError(f"{PORT_ENV}={raw!r} is outside 0-65535")
    return number


def run_rollout_server(
    app: Any,
    *,
    host: str | None = None,
    port: int | None = None,
    workers: int | None = None,
    **uvicorn_options: Any,
) -> None:
    """Serve ``app`` with uvicorn until interrupted.

    The port comes from ``port``, else ``$_OSMOSIS_ROLLOUT_PORT``, else 8000; the host from
    ``host``, else ``$OSMOSIS_ROLLOUT_HOST``, else 127.0.0.1 (loopback only: set
    ``OSMOSIS_ROLLOUT_HOST=0.0.0.0`` to accept remote controllers, ideally with an api_key).
    uvicorn's per-request access log is off: a controller makes several requests per rollout
    and journals each rollout itself, so the log would cost CPU and bury the lines that
    matter; pass ``access_log=True`` to have it back. No websocket routes are served, so no
    websocket library is loaded either (``ws="none"``): it would only slow the start-up.
    The garbage collector is set for serving (:func:`settle_heap`).

    ``workers`` (else ``$OSMOSIS_ROLLOUT_WORKERS``, a number or ``auto`` for one per CPU;
    default 1) forks that many processes serving ``app`` on the one port, for workflows
    whose own code keeps one core busy: each rollout runs in one of them, and a request
    about it that reaches another is passed on (see :mod:`osmosis_ai.rollout.server.workers`).
    Backend limits such as ``max_concurrent`` then apply per worker. Needs ``os.fork``.

    ``uvicorn_options`` go to uvicorn (``root_path``, ``ssl_certfile``, ...); an option it
    does not know, a malformed ``root_path``, or one that several workers cannot share
    raises :class:`ServerOptionError` before anything is served.
    """
    import uvicorn

    count = resolve_workers(workers)
    _check_uvicorn_options(uvicorn_options, count)

    options: dict[str, Any] = {
        "log_level": "info",
        "timeout_keep_alive": 2160,
        "access_log": False,
        "ws": "none",
    }
    options.update(uvicorn_options)
    bind_host = host or os.environ.get(HOST_ENV) or DEFAULT_HOST
    port = resolve_port(port)
    settle_heap()  # before any fork: workers share the frozen heap copy-on-write
    if count > 1:
        serve_workers(app, host=bind_host, port=port, workers=count, options=options)
        return
    uvicorn.run(app, host=bind_host, port=port, **options)


def _check_uvicorn_options(options: dict[str, Any], workers: int) -> None:
    import inspect

    import uvicorn

    known = set(inspect.signature(uvicorn.run).parameters) - {"app", "host", "port", "workers"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ServerOptionError(
            f"run_rollout_server got {', '.join(map(repr, unknown))}, which uvicorn does not "
            f"take: see uvicorn.Config for its options (host, port and workers are "
            "run_rollout_server's own)"
        )
    root = cast(object, options.get("root_path", ""))
    if not isinstance(root, str) or (
        root and (not root.startswith("/") or root.endswith("/") or not root.isascii())
    ):
        raise ServerOptionError(
            f"root_path={root!r} is not a root path: use '' or an ASCII path such as '/api' "
            "(a leading '/', no trailing '/')"
        )
    if workers > 1:
        for name in ("reload", "uds", "fd"):
            if options.get(name):
                raise ServerOptionError(
                    f"{name}={options[name]!r} cannot be served by workers={workers}, which "
                    "listen on one TCP host and port: drop it or serve with workers=1"
                )


def settle_heap() -> None:
    """Set this process's garbage collector for serving rollouts.

    What exists now (the app, the workflow's libraries) is frozen out of the collector's
    passes (``gc.freeze``): a full pass over it would otherwise stall every rollout in
    flight, for 50-90 ms about every 800 rollouts. The young generation is collected every
    :data:`YOUNG_GC_THRESHOLD` allocations instead of the interpreter's 700 (2000 from
    3.13): with dozens of rollouts in flight each young pass walks their live objects and
    promotes them, so frequent passes cost about 0.5 ms of CPU per framework rollout, and
    one every 10 000 about 0.1 ms. A threshold the program set itself is kept.
    """
    gc.collect()
    gc.freeze()
    young, middle, old = gc.get_threshold()
    if young in _INTERPRETER_YOUNG_THRESHOLDS:
        gc.set_threshold(YOUNG_GC_THRESHOLD, middle, old)
