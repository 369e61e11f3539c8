"""The bench's model: the scripted chat endpoint answering a multiply tool call, then ``#### 42``.

``python -m osmosis_ai.testing.model_server`` can only script one text reply, so this
launcher serves :class:`ScriptedModelServer` with the two-turn script in its own process:
``python bench/scripted_model.py --port N --latency-ms X`` (OpenAI base URL ``<origin>/v1``).
With ``--calculator`` it answers the bundled multiply templates' rows instead: a
``multiply(val1, val2)`` tool call for the row's numbers, then ``#### <tool result>``.
"""

from __future__ import annotations

import argparse
import re

import uvicorn

from osmosis_ai.testing.model_server import ChatRequest, ScriptedModelServer, ScriptedTurn, ToolCall
from osmosis_ai.testing.scripted_reply import content_text

SCRIPT = [
    ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": 6, "b": 7})]),
    ScriptedTurn(content="#### 42"),
]


OPERANDS = re.compile(r"val1 = (-?[\d.]+)\s+val2 = (-?[\d.]+)")


def calculator(request: ChatRequest) -> ScriptedTurn:
    """A multiply tool call for the row's operands; once it answered, its result."""
    results = [m for m in request.messages if m.get("role") == "tool"]
    if results:
        return ScriptedTurn(content=f"#### {float(content_text(results[-1].get('content'))):.4f}")
    user = next((m for m in request.messages if m.get("role") == "user"), {})
    found = OPERANDS.search(content_text(user.get("content")))
    if found is None:
        return ScriptedTurn(content="ok")  # the model preflight
    a, b = float(found.group(1)), float(found.group(2))
    return ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": a, "b": b})])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--calculator", action="store_true", help="answer the multiply rows")
    args = parser.parse_args()
    if args.calculator:
        server = ScriptedModelServer(responder=calculator, latency_ms=args.latency_ms)
    else:
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
