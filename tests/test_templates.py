"""Bundled templates, ``osmosis template list|apply``, ``osmosis rollout init`` and the workspace
skills: files written, conflicts, ``--force``, configs that load, JSON pinned by golden files."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import re
from pathlib import Path

import pytest

from cli_support import check_golden, invoke, normalise
from osmosis_ai.cli import commands, registry
from osmosis_ai.rollout import AgentWorkflowContext, GraderContext, RolloutSample
from osmosis_ai.workspace import (
    Workspace,
    load_eval_config,
    load_training_config,
    validate_dataset,
)
from osmosis_ai.workspace.agent_files import ROOT_AGENTS_MD
from osmosis_ai.workspace.templates import (
    MANIFEST,
    SKILLS_DIRS,
    apply_template,
    init_rollout,
    install_skills,
    list_templates,
    skill_names,
    templates_root,
)

MULTIPLY = ("multiply-local-openai", "multiply-local-strands")
HARBOR = ("multiply-harbor-openai", "multiply-harbor-strands")
CATALOG = ["copy-digit", *HARBOR, *MULTIPLY]
SKILLS = ["create-rollout", "debug-rollout", "plan-dataset", "prepare-training", "run-evaluation"]
SRC = Path(__file__).resolve().parents[1] / "src" / "osmosis_ai"


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OSMOSIS_ENV_FILE", raising=False)
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", "")


def golden(name, outcome, tmp_path):
    check_golden(name, normalise(outcome, {str(tmp_path): "<TMP>"}))


def files_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


# --- the catalog ------------------------------------------------------------------------------


def test_catalog_lists_every_template_folder():
    names = [info.name for info in list_templates()]
    assert names == CATALOG
    for info in list_templates():
        assert info.description, info.name
        assert info.rollouts == (info.name,)
        assert info.training_ready


@pytest.mark.parametrize("name", MULTIPLY)
def test_multiply_manifest_and_layout(name):
    node = templates_root() / name
    assert (node / MANIFEST).is_file()
    info = next(i for i in list_templates() if i.name == name)
    assert [c.path for c in info.eval_configs] == [f"configs/eval/{name}.toml"]
    assert [c.path for c in info.training_configs] == [f"configs/training/{name}.toml"]
    assert info.eval_configs[0].model_path == "openai/gpt-5-mini"
    assert info.eval_configs[0].secrets == ("OPENAI_API_KEY",)
    assert info.datasets == ("data/multiply.jsonl",)
    rollout = node / "rollouts" / name
    assert sorted(c.name for c in rollout.iterdir() if c.name != "__pycache__") == [
        "README.md",
        "main.py",
        "pyproject.toml",
    ]
    extra = "openai-agents" if name.endswith("openai") else "strands"
    assert f"osmosis-ai[server,{extra}]" in (rollout / "pyproject.toml").read_text()
    assert "run_rollout_server" in (rollout / "main.py").read_text()


@pytest.mark.parametrize("name", HARBOR)
def test_harbor_multiply_templates_run_one_task_with_the_grader_as_verifier(tmp_path, name):
    node = templates_root() / name
    info = next(i for i in list_templates() if i.name == name)
    assert [c.path for c in info.eval_configs] == [f"configs/eval/{name}.toml"]
    assert info.eval_configs[0].model_path == "openai/gpt-5-mini"
    assert info.datasets == ("data/multiply.jsonl",)
    local = name.replace("harbor", "local")
    assert (node / "data/multiply.jsonl").read_bytes() == (
        templates_root() / local / "data/multiply.jsonl"
    ).read_bytes()
    rollout = node / "rollouts" / name
    task = rollout / "multiply_harbor_task"
    assert (task / "task.toml").is_file() and (task / "environment" / "Dockerfile").is_file()
    assert not (task / "tests").exists()  # the grader is the verifier
    extra = "openai-agents" if name.endswith("openai") else "strands"
    assert f"osmosis-ai[server,harbor,{extra}]" in (rollout / "pyproject.toml").read_text()
    main = (rollout / "main.py").read_text()
    assert "HarborBackend(" in main and "LocalBackend" not in main
    applied = apply_template(name, tmp_path)
    assert f"rollouts/{name}/multiply_harbor_task/task.toml" in applied.files_written
    workspace = Workspace(tmp_path)
    assert load_eval_config(tmp_path / f"configs/eval/{name}.toml", workspace).secrets == (
        "OPENAI_API_KEY",
    )
    assert load_training_config(tmp_path / f"configs/training/{name}.toml", workspace)


def test_the_multiply_dataset_is_shared_and_correct(tmp_path):
    first, second = (templates_root() / name / "data" / "multiply.jsonl" for name in MULTIPLY)
    assert first.read_bytes() == second.read_bytes()
    path = tmp_path / "multiply.jsonl"
    path.write_bytes(first.read_bytes())
    assert validate_dataset(path).valid
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 20
    for row in rows:
        assert set(row) == {"system_prompt", "user_prompt", "ground_truth"}
        a, b = (float(v) for v in re.findall(r"= (-?[\d.]+)", row["user_prompt"]))
        assert row["user_prompt"].startswith("val1 = ") and "\nval2 = " in row["user_prompt"]
        assert abs(a * b - float(row["ground_truth"])) < 1e-2


def test_template_list_golden(capsys, tmp_path):
    result = invoke(capsys, "template", "list", "--json")
    assert result.code == 0
    assert [item["name"] for item in result.json()["items"]] == CATALOG
    golden("template_list", result, tmp_path)
    plain = invoke(capsys, "template", "list", "--plain")
    assert [line.split("\t")[0] for line in plain.out.splitlines()] == CATALOG


# --- template apply ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", MULTIPLY)
def test_apply_into_an_empty_directory_makes_a_workspace(tmp_path, name):
    applied = apply_template(name, tmp_path)
    recipe = {
        f"rollouts/{name}/main.py",
        f"rollouts/{name}/pyproject.toml",
        f"rollouts/{name}/README.md",
        f"configs/eval/{name}.toml",
        f"configs/training/{name}.toml",
        "data/multiply.jsonl",
        ".gitignore",
    }
    assert set(applied.files_written) == recipe
    assert (tmp_path / ".gitignore").read_text().splitlines()[-1] == ".osmosis/"
    assert "AGENTS.md" in applied.scaffold_created and "data/.gitkeep" in applied.scaffold_created
    assert len(applied.skills_written) == 2 * len(SKILLS)
    assert MANIFEST not in files_under(tmp_path)
    assert not any("__pycache__" in path for path in files_under(tmp_path))
    workspace = Workspace(tmp_path)
    evaluation = load_eval_config(tmp_path / f"configs/eval/{name}.toml", workspace)
    assert evaluation.experiment.model_path == "openai/gpt-5-mini"
    assert evaluation.experiment.dataset == "multiply"
    assert evaluation.secrets == ("OPENAI_API_KEY",)
    training = load_training_config(tmp_path / f"configs/training/{name}.toml", workspace)
    assert training.experiment.rollout == name


def test_apply_inside_a_workspace_writes_at_its_root(tmp_path):
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "notes").mkdir()
    applied = apply_template("multiply-local-strands", tmp_path / "notes")
    assert applied.root == tmp_path
    assert applied.scaffold_created == ()  # an existing workspace keeps its own layout
    assert (tmp_path / "rollouts/multiply-local-strands/main.py").is_file()
    assert not (tmp_path / "notes" / "rollouts").exists()


def test_apply_both_multiply_templates_shares_the_dataset(tmp_path):
    apply_template("multiply-local-openai", tmp_path)
    second = apply_template("multiply-local-strands", tmp_path)
    assert second.files_unchanged == ("data/multiply.jsonl",)
    assert second.skills_written == ()


def test_template_apply_golden(capsys, tmp_path):
    result = invoke(capsys, "template", "apply", "multiply-local-openai", "--json")
    assert result.code == 0, result.err
    envelope = result.json()
    assert envelope["operation"] == "template.apply"
    assert envelope["resource"]["template"] == "multiply-local-openai"
    assert envelope["resource"]["workspace"] == str(tmp_path)
    commands_ = [step["command"] for step in envelope["next_steps_structured"]]
    assert commands_ == [
        "osmosis eval run configs/eval/multiply-local-openai.toml",
        "osmosis train run configs/training/multiply-local-openai.toml",
    ]
    golden("template_apply", result, tmp_path)
    plain = invoke(capsys, "template", "apply", "multiply-local-openai", "--plain")
    assert "OPENAI_BASE_URL" in plain.out and "OPENAI_API_KEY" in plain.out


def test_template_apply_conflict_writes_nothing_and_force_overwrites(capsys, tmp_path):
    assert invoke(capsys, "template", "apply", "multiply-local-openai", "--json").code == 0
    main = tmp_path / "rollouts/multiply-local-openai/main.py"
    original = main.read_text()
    main.write_text("# mine\n")
    (tmp_path / "configs/eval/multiply-local-openai.toml").unlink()
    result = invoke(capsys, "template", "apply", "multiply-local-openai", "--json")
    assert result.code == 1 and result.out == ""
    error = result.error()["error"]
    assert error["code"] == "CONFLICT"
    assert error["details"]["conflicts"] == ["rollouts/multiply-local-openai/main.py"]
    assert main.read_text() == "# mine\n"
    assert not (tmp_path / "configs/eval/multiply-local-openai.toml").exists()  # all or nothing
    golden("template_apply_conflict", result, tmp_path)

    forced = invoke(capsys, "template", "apply", "multiply-local-openai", "--force", "--json")
    assert forced.code == 0
    assert forced.json()["resource"]["files_written"] == [
        "rollouts/multiply-local-openai/main.py",
        "configs/eval/multiply-local-openai.toml",
    ]
    assert main.read_text() == original


def test_template_apply_unknown_name(capsys, tmp_path):
    result = invoke(capsys, "template", "apply", "nope", "--json")
    assert result.code == 1
    assert result.error()["error"]["code"] == "NOT_FOUND"
    assert list(tmp_path.iterdir()) == []
    golden("template_apply_unknown", result, tmp_path)


# --- rollout init -----------------------------------------------------------------------------


def test_rollout_init_golden_and_configs_load(capsys, tmp_path):
    assert invoke(capsys, "doctor", "--fix", "--json").code == 0
    result = invoke(capsys, "rollout", "init", "my-agent", "--json")
    assert result.code == 0, result.err
    assert result.json()["resource"]["files_written"] == [
        "rollouts/my-agent/README.md",
        "rollouts/my-agent/main.py",
        "rollouts/my-agent/pyproject.toml",
        "configs/eval/my-agent.toml",
        "configs/training/my-agent.toml",
    ]
    golden("rollout_init", result, tmp_path)
    workspace = Workspace(tmp_path)
    evaluation = load_eval_config(tmp_path / "configs/eval/my-agent.toml", workspace)
    assert (evaluation.experiment.rollout, evaluation.experiment.dataset) == ("my-agent",) * 2
    training = load_training_config(tmp_path / "configs/training/my-agent.toml", workspace)
    assert training.entrypoint_path == tmp_path / "rollouts/my-agent/main.py"
    text = "".join(p.read_text() for p in (tmp_path / "rollouts/my-agent").iterdir())
    assert "{{" not in text and "my-agent" in text


def test_scaffold_main_runs_as_documented(tmp_path):
    (tmp_path / "configs").mkdir()
    init_rollout("my-agent", tmp_path)
    spec = importlib.util.spec_from_file_location(
        "scaffold_main", tmp_path / "rollouts/my-agent/main.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    prompt = [{"role": "user", "content": "hi"}]
    with pytest.raises(NotImplementedError, match=r"rollouts/my-agent/main\.py"):
        asyncio.run(module.MyAgentWorkflow().run(AgentWorkflowContext(prompt=prompt)))
    ctx = GraderContext(label="x", sample=RolloutSample(messages=prompt))
    asyncio.run(module.MyGrader().grade(ctx))
    assert ctx.sample is not None and ctx.sample.reward == 0.0
    assert callable(module.main)


def test_rollout_init_conflict_and_force(capsys, tmp_path):
    (tmp_path / "rollouts").mkdir()
    assert invoke(capsys, "rollout", "init", "my-agent").code == 0
    again = invoke(capsys, "rollout", "init", "my-agent", "--json")
    assert again.code == 0 and again.json()["resource"]["files_written"] == []
    main = tmp_path / "rollouts/my-agent/main.py"
    main.write_text("# edited\n")
    result = invoke(capsys, "rollout", "init", "my-agent", "--json")
    assert result.code == 1
    assert result.error()["error"]["details"]["conflicts"] == ["rollouts/my-agent/main.py"]
    golden("rollout_init_conflict", result, tmp_path)
    assert main.read_text() == "# edited\n"
    forced = invoke(capsys, "rollout", "init", "my-agent", "-f", "--json")
    assert forced.code == 0
    assert forced.json()["resource"]["files_written"] == ["rollouts/my-agent/main.py"]
    assert "MyAgentWorkflow" in main.read_text()


@pytest.mark.parametrize("name", ["Bad", "default", "1st", "my_agent"])
def test_rollout_init_rejects_bad_names(capsys, tmp_path, name):
    (tmp_path / "rollouts").mkdir()
    result = invoke(capsys, "rollout", "init", name, "--json")
    assert result.code == 1
    assert result.error()["error"]["code"] == "VALIDATION"
    assert list((tmp_path / "rollouts").iterdir()) == []
    if name == "Bad":
        golden("rollout_init_invalid_name", result, tmp_path)


def test_rollout_init_needs_a_workspace(capsys, tmp_path):
    result = invoke(capsys, "rollout", "init", "my-agent", "--json")
    assert result.code == 1
    assert result.error()["error"]["code"] == "WORKSPACE_REQUIRED"
    assert list(tmp_path.iterdir()) == []
    golden("rollout_init_no_workspace", result, tmp_path)


# --- skills -----------------------------------------------------------------------------------


def skill_texts() -> dict[str, str]:
    root = templates_root() / "skills"
    return {name: (root / name / "SKILL.md").read_text(encoding="utf-8") for name in skill_names()}


def test_skills_have_front_matter():
    texts = skill_texts()
    assert sorted(texts) == SKILLS
    for name, text in texts.items():
        match = re.match(r"---\nname: (.+)\ndescription: (.+)\n---\n", text)
        assert match, f"{name}: front matter must hold name and description"
        assert match.group(1) == name
        assert len(match.group(2)) > 40
        assert len(text.splitlines()) < 80, f"{name} should stay short"


ROOT_FLAGS = {"--json", "--plain"}
ROOT_VALUE_FLAGS = {"--env-file", "--platform"}
COMMAND = re.compile(r"(?:^|(?<=[\s`(]))osmosis((?:[ \t]+[^\s`|;#)]+)+)", re.MULTILINE)


def command_lines(text: str) -> list[tuple[tuple[str, ...], list[str]]]:
    """Every ``osmosis ...`` invocation: the command path and the tokens after it."""
    found: list[tuple[tuple[str, ...], list[str]]] = []
    for match in COMMAND.finditer(text):
        tokens = [token.rstrip(".,:") for token in match.group(1).split()]
        while tokens and tokens[0].startswith("-"):
            flag = tokens.pop(0)
            assert flag in ROOT_FLAGS | ROOT_VALUE_FLAGS, f"unknown root option {flag}"
            if flag in ROOT_VALUE_FLAGS:
                tokens.pop(0)
        path: tuple[str, ...] = ()
        while tokens and (
            registry.group((*path, tokens[0])) or registry.command((*path, tokens[0]))
        ):
            path = (*path, tokens.pop(0))
        found.append((path, tokens))
    return found


def option_strings(module_name: str) -> set[str]:
    parser = argparse.ArgumentParser()
    commands.load(module_name).add_arguments(parser)
    return {option for action in parser._actions for option in action.option_strings}


@pytest.mark.parametrize(
    "source", [*SKILLS, "AGENTS.md"], ids=lambda s: s if s == "AGENTS.md" else f"skill-{s}"
)
def test_skills_name_only_real_commands_and_flags(source):
    text = ROOT_AGENTS_MD if source == "AGENTS.md" else skill_texts()[source]
    found = command_lines(text)
    assert found, f"{source} names no osmosis command"
    for path, rest in found:
        command = registry.command(path)
        assert command is not None, f"{source}: `osmosis {' '.join(path)}` is not a command"
        assert command.module not in (registry.PENDING, registry.NEEDS_PLATFORM), (
            f"{source}: `osmosis {command.name}` is not available offline"
        )
        known = option_strings(command.module) | ROOT_FLAGS
        for token in rest:
            flag = token.split("=", 1)[0]
            if re.match(r"^--?[A-Za-z]", flag):
                assert flag in known, f"{source}: `osmosis {command.name}` has no option {flag}"


def test_skills_name_only_real_output_files():
    """Every ``*.json``, ``*.jsonl`` and ``*.txt`` file a skill names is one the code writes."""
    sources = "\n".join(
        p.read_text(encoding="utf-8")
        for p in SRC.rglob("*.py")
        if p.relative_to(SRC).parts[0] != "templates"
    )
    pattern = re.compile(r"(?<![\w<>/.-])([A-Za-z_][\w.-]*\.(?:jsonl?|txt))\b")
    for name, text in skill_texts().items():
        for file_name in set(pattern.findall(text)):
            assert f'"{file_name}"' in sources, f"{name} names {file_name}, which no module writes"


def test_agents_md_points_at_every_skill():
    for name in SKILLS:
        assert f"`{name}`" in ROOT_AGENTS_MD
    assert ".agents/skills/" in ROOT_AGENTS_MD


def test_skills_are_mirrored_and_never_overwritten(tmp_path):
    written = install_skills(tmp_path)
    assert len(written) == 2 * len(SKILLS)
    for name in SKILLS:
        copies = [(tmp_path / base / name / "SKILL.md").read_bytes() for base in SKILLS_DIRS]
        assert (
            copies[0] == copies[1] == (templates_root() / "skills" / name / "SKILL.md").read_bytes()
        )
    mine = tmp_path / ".claude/skills/debug-rollout/SKILL.md"
    mine.write_text("my notes\n")
    (tmp_path / ".agents/skills/plan-dataset/SKILL.md").unlink()
    assert install_skills(tmp_path) == [tmp_path / ".agents/skills/plan-dataset/SKILL.md"]
    assert mine.read_text() == "my notes\n"


def test_apply_keeps_a_gitignore_and_adds_the_local_runs_once(tmp_path):
    (tmp_path / ".gitignore").write_text("*.log")
    first = apply_template("multiply-local-openai", tmp_path)
    second = apply_template("copy-digit", tmp_path)
    lines = (tmp_path / ".gitignore").read_text().splitlines()
    assert lines[0] == "*.log" and lines.count(".osmosis/") == 1
    assert ".gitignore" in first.files_written and ".gitignore" not in second.files_written
