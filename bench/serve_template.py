"""Serve a rollout entrypoint file under whichever osmosis-ai build this interpreter has.

``python bench/serve_template.py PATH`` runs ``PATH`` as ``__main__``. Our build serves it
with its own ``run_rollout_server``. A build without that helper (the original 0.3.8, whose
entrypoints call uvicorn themselves) gets one with the same uvicorn settings as ours, so the
same unmodified template file runs on both and only the SDK underneath differs.
"""

from __future__ import annotations

import os
import runpy
import sys
from typing import Any

HOST = "127.0.0.1"


def uvicorn_runner(app: Any, **options: Any) -> None:
    """``run_rollout_server`` for builds that lack it: our defaults, loopback only."""
    import uvicorn

    settings: dict[str, Any] = {"log_level": "info", "timeout_keep_alive": 2160}
    settings["access_log"] = False
    settings.update(options)
    settings.pop("host", None)
    port = int(settings.pop("port", None) or os.environ.get("_OSMOSIS_ROLLOUT_PORT", "8000"))
    uvicorn.run(app, host=HOST, port=port, **settings)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: serve_template.py ENTRYPOINT.py")
    import osmosis_ai.rollout.server as server

    if not hasattr(server, "run_rollout_server"):
        server.run_rollout_server = uvicorn_runner  # type: ignore[attr-defined]
    path = sys.argv[1]
    sys.argv = [path]
    runpy.run_path(path, run_name="__main__")


if __name__ == "__main__":
    main()
