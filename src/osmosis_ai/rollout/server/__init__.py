"""The HTTP rollout server (extra ``server``): ``create_rollout_server`` and a runner.

A rollout entrypoint builds a backend and serves it::

    app = create_rollout_server(backend=LocalBackend(workflow=MyWorkflow, grader=MyGrader))
    if __name__ == "__main__":
        run_rollout_server(app)   # 127.0.0.1:$_OSMOSIS_ROLLOUT_PORT (default 8000)
"""

from osmosis_ai.rollout.server.app import ServerOptionError, create_rollout_server
from osmosis_ai.rollout.server.run import run_rollout_server

__all__ = ["ServerOptionError", "create_rollout_server", "run_rollout_server"]
