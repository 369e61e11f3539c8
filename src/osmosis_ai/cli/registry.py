"""The command table: every group and command the ``osmosis`` CLI knows, with one-line help.

Static data only, so the root help and command resolution import nothing. A command's
``module`` (under ``osmosis_ai.cli.commands``) is imported when that command runs; adding a
command is one ``Command`` line here plus a module with ``add_arguments`` and ``run``.
"""

from __future__ import annotations

WORKFLOW = "Workflow Commands"
PLATFORM = "Platform Commands"
PANELS = (WORKFLOW, PLATFORM)

# Placeholder modules: ``pending`` answers "not available yet", ``platform`` answers
# "needs a platform". Replacing one is changing the module name of its line.
PENDING = "pending"
NEEDS_PLATFORM = "platform"


# Plain classes, not dataclasses: importing dataclasses (and typing) would double the
# start-up time of `osmosis --help`.


class Group:
    """A command group (``dataset``, ``benchmark runs``); top-level groups sit in a panel."""

    __slots__ = ("help", "hidden", "panel", "path")

    def __init__(self, path: tuple[str, ...], help: str, panel: str, hidden: bool) -> None:
        self.path = path
        self.help = help
        self.panel = panel
        self.hidden = hidden


class Command:
    """A runnable command; ``module`` names its module under ``osmosis_ai.cli.commands``."""

    __slots__ = ("help", "module", "panel", "path")

    def __init__(self, path: tuple[str, ...], help: str, module: str, panel: str) -> None:
        self.path = path
        self.help = help
        self.module = module
        self.panel = panel  # used by top-level commands only

    @property
    def name(self) -> str:
        return " ".join(self.path)


def _cmd(name: str, help: str, module: str, panel: str = WORKFLOW) -> Command:
    return Command(tuple(name.split()), help, module, panel)


def _group(name: str, help: str, panel: str = WORKFLOW, *, hidden: bool = False) -> Group:
    return Group(tuple(name.split()), help, panel, hidden)


GROUPS: tuple[Group, ...] = (
    _group("dataset", "Validate dataset files; upload and manage them on a platform."),
    _group("eval", "Evaluate a rollout locally or on a platform."),
    _group("train", "Train a model with reinforcement learning."),
    _group("rollout", "Create rollouts in a workspace."),
    _group("template", "Apply ready-made workspace recipes."),
    _group("auth", "Log in to a platform and manage credentials.", PLATFORM),
    _group("model", "List, inspect and deploy trained models.", PLATFORM),
    _group("secret", "Manage secrets stored on a platform.", PLATFORM),
    _group("benchmark", "List, submit and inspect benchmark runs.", PLATFORM),
    _group("benchmark runs", "Inspect and manage benchmark runs.", PLATFORM),
    _group("platform", "Run and administer a self-hosted platform.", PLATFORM),
    _group("platform user", "Manage the platform's users.", PLATFORM),
    _group("platform workspace", "Manage workspaces and their members.", PLATFORM),
    _group("platform token", "Create and revoke API tokens.", PLATFORM),
    _group("platform model", "Register base models.", PLATFORM),
    _group("dev", "Developer tools.", PLATFORM, hidden=True),
    _group("dev server", "Remote rollout servers for development.", PLATFORM, hidden=True),
)

COMMANDS: tuple[Command, ...] = (
    # Workflow commands that run locally.
    _cmd("doctor", "Check the workspace scaffold; --fix creates what is missing.", "doctor"),
    _cmd("dataset validate", "Validate a dataset file (jsonl, csv, parquet).", "dataset_validate"),
    _cmd("eval run", "Run an evaluation locally.", "eval_run"),
    _cmd("eval rubric", "Score conversations with an LLM judge.", "eval_rubric"),
    _cmd("train run", "Train locally.", "train_run"),
    _cmd("rollout init", "Scaffold a new rollout and its configs.", "rollout_init"),
    _cmd("template list", "List the workspace recipes.", "template_list"),
    _cmd("template apply", "Copy a recipe into the workspace.", "template_apply"),
    # Commands that talk to a platform.
    _cmd("quickstart", "Guided setup: sign in, pick a workspace.", NEEDS_PLATFORM, PLATFORM),
    _cmd("upgrade", "Upgrade osmosis-ai with the installer that installed it.", PENDING, PLATFORM),
    _cmd("dataset upload", "Validate and upload a dataset file.", "dataset_upload"),
    _cmd("dataset download", "Download a stored dataset.", "dataset_download"),
    _cmd("dataset list", "List datasets.", "dataset_list"),
    _cmd("dataset info", "Show a dataset and its processing status.", "dataset_info"),
    _cmd("dataset logs", "Show a dataset's processing logs.", "dataset_logs"),
    _cmd("dataset preview", "Show the first rows of a dataset.", "dataset_preview"),
    _cmd("eval submit", "Submit a managed evaluation run.", "eval_submit"),
    _cmd("eval upload", "Upload a completed local evaluation run.", "eval_upload"),
    _cmd("eval list", "List evaluation runs.", "eval_list"),
    _cmd("eval info", "Show an evaluation run with its results and metrics.", "eval_info"),
    _cmd("eval logs", "Show an evaluation run's logs.", "eval_logs"),
    _cmd("eval download", "Download an evaluation run's outputs.", "eval_download"),
    _cmd("eval stop", "Stop an evaluation run.", "eval_stop"),
    _cmd("train submit", "Submit a training run.", "train_submit"),
    _cmd("train list", "List training runs.", "train_list"),
    _cmd("train info", "Show a training run, its progress and metrics.", "train_info"),
    _cmd("train logs", "Show a training run's logs.", "train_logs"),
    _cmd("train stop", "Stop a training run.", "train_stop"),
    _cmd("train download", "Download a training run's checkpoint.", "train_download"),
    _cmd("rollout list", "List rollouts discovered by Git Sync.", "rollout_list"),
    _cmd("auth login", "Log in (device code or token).", "auth_login"),
    _cmd("auth logout", "Log out and revoke the stored token.", "auth_logout"),
    _cmd("auth whoami", "Show who is logged in, where.", "auth_whoami"),
    _cmd("model list", "List base and LoRA models.", "model_list"),
    _cmd("model info", "Show a LoRA model.", "model_info"),
    _cmd("model deploy", "Deploy a LoRA model.", "model_deploy"),
    _cmd("model undeploy", "Undeploy a LoRA model.", "model_undeploy"),
    _cmd("secret list", "List secret names.", "secret_list"),
    _cmd("secret set", "Create or update a secret.", "secret_set"),
    _cmd("secret delete", "Delete a secret.", "secret_delete"),
    _cmd("benchmark list", "List benchmarks.", NEEDS_PLATFORM),
    _cmd("benchmark info", "Show a benchmark.", NEEDS_PLATFORM),
    _cmd("benchmark submit", "Submit a benchmark run.", NEEDS_PLATFORM),
    _cmd("benchmark runs list", "List benchmark runs.", NEEDS_PLATFORM),
    _cmd("benchmark runs info", "Show a benchmark run.", NEEDS_PLATFORM),
    _cmd("benchmark runs logs", "Show a benchmark run's logs.", NEEDS_PLATFORM),
    _cmd("benchmark runs stop", "Stop a benchmark run.", NEEDS_PLATFORM),
    _cmd("benchmark runs download", "Download a benchmark run's outputs.", NEEDS_PLATFORM),
    # Running a self-hosted platform: these work on its data dir, not over HTTP.
    _cmd("platform serve", "Serve the platform (API and login page).", "platform_serve", PLATFORM),
    _cmd(
        "platform worker",
        "Execute submitted eval and training runs here.",
        "platform_worker",
        PLATFORM,
    ),
    _cmd("platform user create", "Add a user.", "platform_user_create", PLATFORM),
    _cmd(
        "platform workspace create",
        "Create a workspace for a repository.",
        "platform_workspace_create",
        PLATFORM,
    ),
    _cmd(
        "platform workspace add-member",
        "Add a user to a workspace, or change their role.",
        "platform_workspace_add_member",
        PLATFORM,
    ),
    _cmd(
        "platform token create",
        "Create an API token (shown once).",
        "platform_token_create",
        PLATFORM,
    ),
    _cmd("platform token revoke", "Revoke an API token.", "platform_token_revoke", PLATFORM),
    _cmd(
        "platform model add", "Register a local Hugging Face model.", "platform_model_add", PLATFORM
    ),
    _cmd("dev server up", "Start a remote rollout server.", NEEDS_PLATFORM),
    _cmd("dev server down", "Tear down a remote rollout server.", NEEDS_PLATFORM),
    _cmd("dev server list", "List remote rollout servers.", NEEDS_PLATFORM),
    _cmd("dev server logs", "Show a remote rollout server's logs.", NEEDS_PLATFORM),
)

# Commands that existed once: recognised so that the error can say what replaced them.
REMOVED: dict[tuple[str, ...], str] = {
    ("deploy",): "Use 'osmosis model deploy'.",
    ("deployment",): "Use 'osmosis model list' and 'osmosis model info'.",
    ("undeploy",): "Use 'osmosis model undeploy'.",
    ("init",): "Use 'osmosis doctor --fix', then 'osmosis rollout init NAME'.",
    ("link",): "A workspace is the Git repository you are in; check it with 'osmosis doctor'.",
    ("unlink",): "A workspace is the Git repository you are in; check it with 'osmosis doctor'.",
    ("workspace",): "Use 'osmosis doctor' and 'osmosis auth whoami'.",
    ("login",): "Use 'osmosis auth login'.",
    ("logout",): "Use 'osmosis auth logout'.",
    ("whoami",): "Use 'osmosis auth whoami'.",
    ("dataset", "delete"): "Delete datasets in the platform's web UI.",
    ("model", "delete"): "Delete models in the platform's web UI.",
    ("rollout", "validate"): "Try the rollout with 'osmosis eval run CONFIG --rows 0-3'.",
    ("train", "delete"): "Delete training runs in the platform's web UI.",
    ("train", "traces"): "Use 'osmosis train info NAME'.",
}

_GROUPS = {group.path: group for group in GROUPS}
_COMMANDS = {command.path: command for command in COMMANDS}


def group(path: tuple[str, ...]) -> Group | None:
    return _GROUPS.get(path)


def command(path: tuple[str, ...]) -> Command | None:
    return _COMMANDS.get(path)


def children(path: tuple[str, ...], *, include_hidden: bool = False) -> list[Group | Command]:
    """The groups and commands directly under ``path`` (``()`` is the root), in table order."""
    depth = len(path) + 1
    found: list[Group | Command] = [
        entry
        for entry in (*GROUPS, *COMMANDS)
        if len(entry.path) == depth
        and entry.path[:-1] == path
        and (include_hidden or not (isinstance(entry, Group) and entry.hidden))
    ]
    return found


def suggest(path: tuple[str, ...], name: str) -> str | None:
    """The visible name under ``path`` that ``name`` is most likely a typo of."""
    import difflib

    names = [entry.path[-1] for entry in children(path)]
    matches = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    return matches[0] if matches else None
