#!/usr/bin/env bash
# Regenerate the pins the Harbor tier installs with (scripts/constraints/*.txt), with uv's
# resolver (pip backtracks past its depth limit on these trees): the newest Harbor the extra
# accepts, the oldest (0.20.0), and the mini-swe-agent harness. Run after changing the extras
# or to take newer releases; `make setup` provides uv in .venv.
# Harbor 0.26 needs mcp >= 2.3 and every strands-agents release needs mcp < 2.2, so the
# newest Harbor's tier leaves the strands extra out (its Strands tests skip, naming why).
set -euo pipefail
cd "$(dirname "$0")/.."
uv="${UV:-.venv/bin/uv}"
out=scripts/constraints
mkdir -p "$out"
compile() { # <output> <requirement or -> [extras...]
  local target="$1" requirement="$2"
  shift 2
  local extras=()
  for extra in "$@"; do extras+=(--extra "$extra"); done
  {
    echo "# Pins for the Harbor tier, made by scripts/lock_harbor.sh; do not edit by hand."
    printf '%s\n' "$requirement" | "$uv" pip compile - ${extras:+pyproject.toml} "${extras[@]}" \
      --python-version 3.12 --universal --no-annotate --no-header
  } > "$target"
  echo "lock-harbor: wrote $target ($(grep -c '==' "$target") pins)"
}
compile "$out/harbor-newest.txt" "harbor>=0.26,<0.27" server harbor openai-agents test
compile "$out/harbor-0.20.0.txt" "harbor==0.20.0" server harbor strands openai-agents test
compile "$out/mini-swe-agent.txt" "mini-swe-agent"
