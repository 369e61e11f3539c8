"""The bench's model: the scripted chat endpoint answering a multiply tool call, then ``#### 42``.

``python -m osmosis_ai.testing.model_server`` can only script one text reply, so this
launcher serves :class:`ScriptedModelServer` with the two-turn script in its own process:
``python bench/scripted_model.py --port N --latency-ms X`` (OpenAI base URL ``<origin>/v1``).
"""

from __future__ import annotations

import argparse

import uvicorn

from osmosis_ai.testing.model_server import ScriptedModelServer, ScriptedTurn, ToolCall

SCRIPT = [
    ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": 6, "b": 7})]),
    ScriptedTurn(content="#### 42"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    args = parser.parse_args()
    server = ScriptedModelServer(SCRIPT, on_exhausted="repeat_last", latency_ms=args.latency_ms)
    uvicorn.run(
        server,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_keep_alive=600,
    )


if __name__ == "__main__":
    main()
