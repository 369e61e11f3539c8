"""LLM-as-judge scoring against a real scripted judge on 127.0.0.1, and ``osmosis eval rubric``."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from cli_support import check_golden, invoke, normalise
from osmosis_ai.errors import MissingExtraError
from osmosis_ai.eval.rubric import (
    DEFAULT_SYSTEM_PROMPT,
    LiteLLMNotInstalledError,
    MissingAPIKeyError,
    ModelNotFoundError,
    ProviderRequestError,
    RubricDatasetError,
    RubricRecord,
    RubricResult,
    evaluate_rubric,
    evaluate_rubric_dataset,
    load_rubric_dataset,
)
from osmosis_ai.testing.model_server import ChatRequest, ScriptedModelServer, ScriptedTurn
from osmosis_ai.testing.serving import free_port

MODEL = "openai/judge"
RUBRIC = "Award 1 if the answer is correct, 0 otherwise."
SOLUTION = re.compile(r"<solution>\n(.*)\n</solution>", re.DOTALL)


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE", "OSMOSIS_ENV_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", "")


def verdict(score: object, explanation: str = "because") -> str:
    return json.dumps({"score": score, "explanation": explanation})


def solution_of(request: ChatRequest) -> str:
    match = SOLUTION.search(request.messages[-1]["content"])
    assert match is not None
    return match.group(1)


async def judge(server: ScriptedModelServer, **options) -> RubricResult:
    arguments = {"solution_str": "42", "rubric": RUBRIC, "model": MODEL}
    arguments.update(options)
    arguments.setdefault("base_url", server.base_url)
    return await evaluate_rubric(**arguments)


# --- evaluate_rubric --------------------------------------------------------------------------


async def test_plain_json_verdict_and_the_request_it_came_from():
    async with ScriptedModelServer([verdict(0.75, "mostly right")], record_requests=True) as server:
        result = await judge(server)
    assert result == RubricResult(score=0.75, explanation="mostly right")
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert "authorization" not in request.headers  # loopback: no key needed
    assert request.body["model"] == "judge"
    assert request.body["response_format"]["type"] == "json_schema"
    schema = request.body["response_format"]["json_schema"]["schema"]
    assert schema["properties"] == {"score": {"type": "number"}, "explanation": {"type": "string"}}
    system, user = request.body["messages"]
    assert system == {"role": "system", "content": DEFAULT_SYSTEM_PROMPT}
    assert (
        user["role"] == "user"
        and RUBRIC in user["content"]
        and "<solution>\n42\n" in user["content"]
    )


@pytest.mark.parametrize(
    "reply",
    [
        "```json\n" + verdict(1, "exact") + "\n```",
        "```\n" + verdict(1, "exact") + "\n```",
        "Here is my verdict:\n```JSON\n" + verdict("1", "exact") + "\n```\nThanks.",
        "Verdict: " + verdict(1.0, "exact") + " (end)",
    ],
)
async def test_code_fenced_and_wrapped_verdicts(reply):
    async with ScriptedModelServer([reply]) as server:
        assert await judge(server) == RubricResult(1.0, "exact")


@pytest.mark.parametrize(
    ("score", "low", "high", "expected"),
    [(7, 0.0, 1.0, 1.0), (-3, 0.0, 1.0, 0.0), (0.5, 1.0, 10.0, 1.0), (12, 1.0, 10.0, 10.0)],
)
async def test_scores_are_clamped_into_the_range(score, low, high, expected):
    async with ScriptedModelServer([verdict(score)], record_requests=True) as server:
        result = await judge(server, score_min=low, score_max=high)
    assert result.score == expected
    assert f"from {low:g} to {high:g}" in server.requests[0].body["messages"][-1]["content"]


@pytest.mark.parametrize(
    "reply", ["no json here", verdict(True), '{"explanation": "no score"}', '{"score": NaN}']
)
async def test_a_reply_without_a_numeric_score_is_a_provider_error(reply):
    async with ScriptedModelServer([reply]) as server:
        with pytest.raises(ProviderRequestError, match="not a JSON object with a numeric 'score'"):
            await judge(server)


def rejecting(*formats: str):
    """A judge that answers 400 to requests whose response_format type is in ``formats``."""

    def respond(request: ChatRequest) -> ScriptedTurn | str:
        kind = (request.body.get("response_format") or {}).get("type")
        if kind in formats:
            return ScriptedTurn(status_code=400, error=f"response_format {kind} is not supported")
        return verdict(0.5, f"format {kind}")

    return respond


async def test_json_schema_rejected_falls_back_to_json_object():
    server = ScriptedModelServer(responder=rejecting("json_schema"), record_requests=True)
    async with server:
        result = await judge(server)
    assert result == RubricResult(0.5, "format json_object")
    kinds = [r.body.get("response_format", {}).get("type") for r in server.requests]
    assert kinds == ["json_schema", "json_object"]


async def test_both_formats_rejected_falls_back_to_none():
    server = ScriptedModelServer(
        responder=rejecting("json_schema", "json_object"), record_requests=True
    )
    async with server:
        result = await judge(server)
    assert result == RubricResult(0.5, "format None")
    assert ["response_format" in r.body for r in server.requests] == [True, True, False]


async def test_a_400_without_response_format_reports_the_providers_message():
    def respond(request: ChatRequest) -> ScriptedTurn:
        return ScriptedTurn(status_code=400, error="prompt is too long: 9000 tokens")

    async with ScriptedModelServer(responder=respond) as server:
        with pytest.raises(ProviderRequestError) as caught:
            await judge(server)
    assert caught.value.status_code == 400
    assert "HTTP 400: prompt is too long: 9000 tokens" in str(caught.value)
    assert server.request_count == 3  # json_schema, json_object, then none


async def test_auth_error_carries_the_real_message():
    async with ScriptedModelServer([verdict(1)], api_key="right-key") as server:
        with pytest.raises(ProviderRequestError) as caught:
            await judge(server, api_key="wrong-key")
        assert not isinstance(caught.value, ModelNotFoundError)
        assert caught.value.status_code == 401
        assert caught.value.provider == "openai" and caught.value.model == MODEL
        assert "HTTP 401: missing or wrong API key" in caught.value.detail
        assert server.request_count == 1  # an auth failure is not a format problem
        assert (await judge(server, api_key="right-key")).score == 1.0


async def test_api_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "env-key")
    async with ScriptedModelServer([verdict(1)], api_key="env-key", record_requests=True) as server:
        await judge(server)
    assert server.requests[0].headers["authorization"] == "Bearer env-key"


async def test_unknown_model_is_model_not_found():
    def respond(request: ChatRequest) -> ScriptedTurn:
        model = request.body["model"]
        return ScriptedTurn(status_code=404, error=f"The model `{model}` does not exist.")

    async with ScriptedModelServer(responder=respond) as server:
        with pytest.raises(ModelNotFoundError) as caught:
            await judge(server, model="openai/missing")
    assert caught.value.status_code == 404
    assert "HTTP 404: The model `missing` does not exist." in str(caught.value)
    assert server.request_count == 1


async def test_base_url_from_the_environment(monkeypatch):
    async with ScriptedModelServer([verdict(0.25)]) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        result = await evaluate_rubric(solution_str="x", rubric=RUBRIC, model=MODEL)
    assert result.score == 0.25


async def test_missing_key_for_a_remote_endpoint():
    with pytest.raises(MissingAPIKeyError, match="set OPENAI_API_KEY") as caught:
        await evaluate_rubric(
            solution_str="x", rubric=RUBRIC, model=MODEL, base_url="https://judge.example.com/v1"
        )
    assert caught.value.env_var == "OPENAI_API_KEY" and caught.value.provider == "openai"
    with pytest.raises(MissingAPIKeyError):  # the default endpoint is the OpenAI API
        await evaluate_rubric(solution_str="x", rubric=RUBRIC, model=MODEL)


async def test_unreachable_judge_and_timeout():
    with pytest.raises(ProviderRequestError, match="cannot reach"):
        await evaluate_rubric(
            solution_str="x",
            rubric=RUBRIC,
            model=MODEL,
            base_url=f"http://127.0.0.1:{free_port()}/v1",
        )
    async with ScriptedModelServer([ScriptedTurn(verdict(1), latency_ms=2000)]) as server:
        with pytest.raises(ProviderRequestError, match=r"no reply from .* within 0\.2 s"):
            await judge(server, timeout=0.2)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"score_min": 1.0, "score_max": 1.0}, "score_max"),
        ({"score_min": 2.0, "score_max": 1.0}, "score_max"),
        ({"solution_str": "  "}, "solution_str"),
        ({"rubric": ""}, "rubric"),
        ({"model": "judge"}, "model"),
        ({"timeout": 0}, "timeout"),
    ],
)
async def test_input_validation(options, named):
    arguments = {
        "solution_str": "42",
        "rubric": RUBRIC,
        "model": MODEL,
        "base_url": "http://127.0.0.1:9/v1",
    }
    arguments.update(options)
    with pytest.raises(ValueError, match=named):
        await evaluate_rubric(**arguments)


async def test_prompt_is_deterministic_and_carries_every_input():
    options = {
        "ground_truth": "42",
        "original_input": "What is 6 * 7?",
        "metadata": {"b": 2, "a": [1, "x"]},
        "system_prompt": "Be strict.",
    }
    async with ScriptedModelServer(
        [verdict(1)] * 2, on_exhausted="repeat_last", record_requests=True
    ) as server:
        await judge(server, **options)
        await judge(server, **dict(reversed(list(options.items()))))
    first, second = (r.body["messages"] for r in server.requests)
    assert first == second
    assert first[0] == {"role": "system", "content": "Be strict."}
    user = first[1]["content"]
    assert user.index("<rubric>") < user.index("<original_input>\nWhat is 6 * 7?\n")
    assert user.index("<ground_truth>\n42\n") < user.index('<metadata>\n{"a": [1, "x"], "b": 2}\n')
    assert user.index("<metadata>") < user.index("<solution>\n42\n</solution>")


async def test_other_providers_need_litellm(monkeypatch):
    monkeypatch.setitem(sys.modules, "litellm", None)
    with pytest.raises(LiteLLMNotInstalledError) as caught:
        await evaluate_rubric(solution_str="x", rubric=RUBRIC, model="anthropic/claude-x")
    message = str(caught.value)
    assert 'pip install "osmosis-ai[litellm]"' in message and "'openai/<model>'" in message
    assert "OPENAI_BASE_URL" in message
    assert isinstance(caught.value, MissingExtraError) and isinstance(caught.value, ImportError)


async def test_litellm_reaches_an_openai_compatible_judge(monkeypatch):
    # LiteLLM fetches its price list from the network on import unless told to use its copy.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    pytest.importorskip("litellm")
    async with ScriptedModelServer([verdict(0.5, "via litellm")], record_requests=True) as server:
        result = await judge(server, model="hosted_vllm/judge")
    assert result == RubricResult(0.5, "via litellm")
    assert server.requests[0].body["model"] == "judge"


def test_import_osmosis_ai_stays_light():
    code = (
        "import sys, osmosis_ai\n"
        "print(sorted(m for m in ('httpx', 'osmosis_ai.eval', 'typing') if m in sys.modules))\n"
        "print(osmosis_ai.evaluate_rubric.__module__, osmosis_ai.ModelNotFoundError.__mro__[1].__name__)\n"
        "print(sorted(set(osmosis_ai.__all__) - set(dir(osmosis_ai))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines() == [
        "[]",
        "osmosis_ai.eval.rubric ProviderRequestError",
        "[]",
    ]


# --- the dataset ----------------------------------------------------------------------------


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_load_rubric_dataset(tmp_path):
    rows = [
        {
            "id": "c1",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "6 * 7?"},
                {"role": "assistant", "content": "41"},
                {"role": "user", "content": "Sure?"},
                {"role": "assistant", "content": [{"type": "text", "text": "42"}]},
            ],
            "ground_truth": 42,
            "metadata": {"level": 1},
        },
        {"conversation_id": 7, "solution_str": "legacy", "original_input": "q?"},
    ]
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    path.write_text(path.read_text() + "\n   \n", encoding="utf-8")
    assert load_rubric_dataset(path) == [
        RubricRecord(1, "42", "c1", "42", "Sure?", {"level": 1}),
        RubricRecord(2, "legacy", "7", None, "q?", None),
    ]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant message"),
        ('{"messages": "hi"}', "'messages' must be a list"),
        ('{"solution_str": 3}', "'solution_str' must be a string"),
        ('{"solution_str": " "}', "the solution"),
        ('{"solution_str": "x", "metadata": [1]}', "'metadata' must be a JSON object"),
    ],
)
def test_bad_dataset_lines_name_their_line(tmp_path, line, reason):
    path = tmp_path / "data.jsonl"
    path.write_text('{"solution_str": "fine"}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(RubricDatasetError, match=f"line 2: {re.escape(reason)}") as caught:
        load_rubric_dataset(path)
    assert caught.value.line == 2 and isinstance(caught.value, ValueError)


async def test_dataset_remembers_the_accepted_format():
    server = ScriptedModelServer(responder=rejecting("json_schema"), record_requests=True)
    records = [RubricRecord(i + 1, f"answer {i}") for i in range(3)]
    async with server:
        report = await evaluate_rubric_dataset(
            records, rubric=RUBRIC, model=MODEL, base_url=server.base_url, runs=2, concurrency=1
        )
    assert server.request_count == 7  # one rejection, then json_object for all six runs
    assert [r.scores for r in report.records] == [[0.5, 0.5]] * 3
    assert report.statistics.to_dict() == {
        "count": 6, "average": 0.5, "variance": 0.0, "stdev": 0.0, "min": 0.5, "max": 0.5,
    }  # fmt: skip


# --- osmosis eval rubric ----------------------------------------------------------------------

CONVERSATIONS = [
    {
        "id": "good",
        "messages": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}],
        "ground_truth": "4",
    },
    {"conversation_id": "close", "solution_str": "4.1", "ground_truth": "4"},
    {"messages": [{"role": "user", "content": "3 + 3?"}, {"role": "assistant", "content": "6"}]},
]
SCORES = {"4": 1.0, "4.1": 0.5, "6": 1.0, "broken": None}


def grading(request: ChatRequest) -> ScriptedTurn | str:
    score = SCORES[solution_of(request)]
    if score is None:
        return ScriptedTurn(status_code=500, error="judge backend exploded")
    return "```json\n" + verdict(score, f"graded {solution_of(request)}") + "\n```"


def rubric_cli(capsys, server, *args):
    return invoke(
        capsys, "eval", "rubric", "-d", "data.jsonl", "-r", RUBRIC, "--model", MODEL,
        "--base-url", server.base_url, *args,
    )  # fmt: skip


def golden(name, outcome, tmp_path, base_url):
    check_golden(name, normalise(outcome, {str(tmp_path): "<TMP>", base_url: "<BASE_URL>"}))


def test_cli_scores_every_record_n_times_and_writes_the_results(capsys, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", CONVERSATIONS)
    (tmp_path / "out").mkdir()
    with ScriptedModelServer(responder=grading, record_requests=True) as server:
        result = rubric_cli(capsys, server, "-n", "2", "-o", "out", "--json")
        base_url = server.base_url
    assert result.code == 0, result.err
    assert result.err == ""
    assert server.request_count == 6
    envelope = result.json()
    assert envelope["operation"] == "eval.rubric" and envelope["status"] == "success"
    resource = envelope["resource"]
    assert [r["scores"] for r in resource["records"]] == [[1.0, 1.0], [0.5, 0.5], [1.0, 1.0]]
    assert [r["id"] for r in resource["records"]] == ["good", "close", None]
    assert resource["statistics"]["average"] == pytest.approx(5 / 6)
    written = tmp_path / "out" / "rubric_eval_result.json"
    assert resource["output"] == str(written)
    assert json.loads(written.read_text(encoding="utf-8")) == resource
    golden("eval_rubric_success", result, tmp_path, base_url)


def test_cli_plain_output_and_rubric_from_a_file(capsys, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", CONVERSATIONS[:2])
    (tmp_path / "rubric.md").write_text(RUBRIC + "\n", encoding="utf-8")
    with ScriptedModelServer(responder=grading, record_requests=True) as server:
        result = invoke(
            capsys, "eval", "rubric", "-d", "data.jsonl", "-r", "@rubric.md", "--model", MODEL,
            "--base-url", server.base_url, "-o", "result.json", "--plain",
        )  # fmt: skip
    assert result.code == 0, result.err
    assert result.out.splitlines() == [
        "Scored 2 record(s), 1 run each, with openai/judge: "
        "average 0.75, stdev 0.25, min 0.5, max 1.",
        f"Results written to {tmp_path / 'result.json'}",
    ]
    assert f"<rubric>\n{RUBRIC}\n</rubric>" in server.requests[0].body["messages"][1]["content"]
    assert json.loads((tmp_path / "result.json").read_text())["statistics"]["variance"] == 0.0625


def test_cli_a_failing_record_exits_1_and_still_writes_the_results(capsys, tmp_path):
    rows = [*CONVERSATIONS[:2], {"id": "bad", "solution_str": "broken"}]
    write_jsonl(tmp_path / "data.jsonl", rows)
    with ScriptedModelServer(responder=grading) as server:
        result = rubric_cli(capsys, server, "-o", "result.json", "--json")
        base_url = server.base_url
    assert result.code == 1 and result.out == ""
    error = result.error()["error"]
    assert error["code"] == "PLATFORM_ERROR"
    assert "HTTP 500: judge backend exploded" in error["message"]
    assert error["details"]["failed"][0]["line"] == 3
    written = json.loads((tmp_path / "result.json").read_text(encoding="utf-8"))
    assert written["failed_records"] == 1
    assert written["records"][2]["runs"] == [{"error": error["details"]["failed"][0]["error"]}]
    assert written["statistics"]["count"] == 2
    golden("eval_rubric_failed_record", result, tmp_path, base_url)


def test_cli_deprecated_api_key_warns(capsys, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", CONVERSATIONS[:1])
    with ScriptedModelServer(responder=grading, api_key="k", record_requests=True) as server:
        result = rubric_cli(capsys, server, "--api-key", "k", "--json")
    assert result.code == 0
    (warning,) = result.stderr_lines()
    assert warning["warning"]["code"] == "DEPRECATION"
    assert server.requests[0].headers["authorization"] == "Bearer k"


@pytest.mark.parametrize(
    ("name", "setup", "args", "code"),
    [
        ("bad_line", '{"solution_str": "4"}\n{oops\n', (), "VALIDATION"),
        ("missing_data", None, (), "NOT_FOUND"),
        ("empty_data", "\n", (), "VALIDATION"),
        ("empty_rubric", '{"solution_str": "4"}\n', ("-r", "  "), "VALIDATION"),
        ("missing_rubric_file", '{"solution_str": "4"}\n', ("-r", "@nope.md"), "NOT_FOUND"),
        (
            "score_range",
            '{"solution_str": "4"}\n',
            ("--score-min", "1", "--score-max", "0"),
            "VALIDATION",
        ),
        (
            "missing_key",
            '{"solution_str": "4"}\n',
            ("--base-url", "https://judge.example.com/v1"),
            "VALIDATION",
        ),
        ("bad_model", '{"solution_str": "4"}\n', ("--model", "judge"), "VALIDATION"),
    ],
)
def test_cli_input_errors(capsys, tmp_path, name, setup, args, code):
    if setup is not None:
        (tmp_path / "data.jsonl").write_text(setup, encoding="utf-8")
    with ScriptedModelServer(responder=grading) as server:
        result = rubric_cli(capsys, server, *args, "--json")
        assert server.request_count == 0
        base_url = server.base_url
    assert result.code == 1 and result.out == ""
    error = result.error()
    assert error["command"] == "eval rubric" and error["error"]["code"] == code
    if name == "bad_line":
        assert error["error"]["details"] == {
            "file": str(tmp_path / "data.jsonl"), "line": 2, "reason": error["error"]["details"]["reason"],
        }  # fmt: skip
        assert "line 2: not valid JSON" in error["error"]["message"]
        golden("eval_rubric_bad_line", result, tmp_path, base_url)
    if name == "missing_key":
        assert error["error"]["details"] == {"env_var": "OPENAI_API_KEY"}


def test_cli_usage_errors(capsys, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", CONVERSATIONS[:1])
    result = invoke(
        capsys, "eval", "rubric", "-d", "data.jsonl", "-r", RUBRIC, "--model", MODEL, "-n", "0"
    )
    assert result.code == 2 and "must be at least 1" in result.err
    assert invoke(capsys, "eval", "rubric", "-d", "data.jsonl").code == 2  # --rubric, --model
    help_text = invoke(capsys, "eval", "rubric", "--help")
    assert help_text.code == 0 and "--base-url" in help_text.out and "--score-max" in help_text.out


def test_cli_output_to_a_new_folder(capsys, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", CONVERSATIONS[:1])
    with ScriptedModelServer(responder=grading) as server:
        result = rubric_cli(capsys, server, "-o", "runs/judge/", "--json")
    assert result.code == 0, result.err
    written = tmp_path / "runs" / "judge" / "rubric_eval_result.json"
    assert result.json()["resource"]["output"] == str(written)
    assert json.loads(written.read_text(encoding="utf-8"))["statistics"]["count"] == 1
