#!/usr/bin/env bash
# Create or refresh .venv-harbor: Python 3.12+ with the harbor extra, for the Harbor test tier
# (`make test-harbor`). Harbor needs Python >= 3.12, so this tier lives beside the 3.11 .venv.
# HARBOR_VERSION=0.20.0 makes .venv-harbor-020 instead, with that Harbor pinned (the tier runs
# on the oldest and the newest Harbor the extra accepts).
# Skips the install when pyproject.toml has not changed since the last successful one.
# Installs bubblewrap (the local sandbox's runner), iproute2 (its allowlist addresses) and tmux
# (terminus-2's terminal) with apt-get when they are missing and we are root. The sandbox also
# needs Linux 5.19+ with user namespaces (the tier's tests skip, naming what is missing).
# Installs the agent harnesses the trials run from a host prefix (HarborBackend's agent_prefix)
# under .harbor-agents/ (OSMOSIS_HARBOR_AGENTS elsewhere; OSMOSIS_HARBOR_AGENTS=none skips):
# mini-swe-agent in its own virtual environment with pip, claude-code with npm (skipped when
# npm is missing). A no-network trial cannot download them, so they are installed here once.
set -euo pipefail
cd "$(dirname "$0")/.."

# Installs use the pins in scripts/constraints/ (scripts/lock_harbor.sh makes them): pip's own
# resolver gives up on these dependency trees. The newest Harbor (0.26) needs an mcp release
# that strands-agents refuses, so its tier leaves the strands extra out and its Strands tests
# skip, naming why; the oldest Harbor's tier has both frameworks.
harbor_version="${HARBOR_VERSION:-}"
venv=".venv-harbor"
constraints="scripts/constraints/harbor-newest.txt"
default_extras="server,harbor,openai-agents,test"
if [ -n "$harbor_version" ]; then
  venv=".venv-harbor-$(echo "$harbor_version" | cut -d. -f1-2 | tr -d .)" # 0.20.0: -020
  constraints="scripts/constraints/harbor-$harbor_version.txt"
  default_extras="server,harbor,strands,openai-agents,test"
fi
extras="${OSMOSIS_HARBOR_EXTRAS:-$default_extras}"
if [ ! -f "$constraints" ]; then
  echo "setup-harbor: no pins for Harbor ${harbor_version:-newest} ($constraints): add the version to scripts/lock_harbor.sh and run it" >&2
  exit 2
fi
stamp="$venv/.osmosis-setup-$(echo "$extras" | tr ',' '-')${harbor_version:+-harbor-$harbor_version}"

find_python() {
  if [ -n "${PYTHON_HARBOR:-}" ]; then
    echo "$PYTHON_HARBOR"
    return 0
  fi
  local candidate pyenv_root
  pyenv_root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")
  for candidate in python3.12 "$pyenv_root"/versions/3.12.*/bin/python python3.13 "$pyenv_root"/versions/3.13.*/bin/python; do
    if command -v "$candidate" >/dev/null 2>&1 \
      && "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

# `setup_harbor.sh --find-python` only says which interpreter the tier would use (exit 1: none).
if [ "${1:-}" = "--find-python" ]; then
  find_python
  exit
fi

# bubblewrap runs the sandbox; tmux is what Harbor's terminus-2 agent types into (the sandbox
# shows the host's programs, so it must be on the host).
missing=()
command -v bwrap >/dev/null 2>&1 || missing+=(bubblewrap)
command -v tmux >/dev/null 2>&1 || missing+=(tmux)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup-harbor: installing ${missing[*]}"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } \
      || echo "setup-harbor: ${missing[*]} could not be installed; the tests that need them will skip"
  else
    echo "setup-harbor: ${missing[*]} missing and cannot be installed here; the tests that need them will skip"
  fi
fi

install_agents() {
  local agents="${OSMOSIS_HARBOR_AGENTS:-.harbor-agents}" python
  [ "$agents" = none ] && return 0
  mkdir -p "$agents"
  if [ ! -x "$agents/mini-swe-agent/bin/mini-swe-agent" ]; then
    if python=$(find_python); then
      local wanted=(-c scripts/constraints/mini-swe-agent.txt mini-swe-agent)
      if [ -n "${MINI_SWE_AGENT_VERSION:-}" ]; then
        wanted=("mini-swe-agent==$MINI_SWE_AGENT_VERSION")
      fi
      echo "setup-harbor: installing mini-swe-agent into $agents/mini-swe-agent"
      { "$python" -m venv "$agents/mini-swe-agent" \
        && "$agents/mini-swe-agent/bin/python" -m pip install --quiet --upgrade pip \
        && "$agents/mini-swe-agent/bin/python" -m pip install --quiet "${wanted[@]}"; } \
        || echo "setup-harbor: mini-swe-agent could not be installed; its tests will skip"
    fi
  fi
  if [ ! -e "$agents/claude-code/node_modules/.bin/claude" ]; then
    if command -v npm >/dev/null 2>&1; then
      echo "setup-harbor: installing claude-code into $agents/claude-code"
      npm install --prefix "$agents/claude-code" --no-fund --no-audit --silent \
        "@anthropic-ai/claude-code${CLAUDE_CODE_VERSION:+@$CLAUDE_CODE_VERSION}" \
        || echo "setup-harbor: claude-code could not be installed; its tests will skip"
    else
      echo "setup-harbor: npm is missing: claude-code is not installed and its tests will skip"
    fi
  fi
}
install_agents

if [ ! -x "$venv/bin/python" ]; then
  if ! python=$(find_python); then
    echo "setup-harbor: no Python >= 3.12 found (set PYTHON_HARBOR to one); Harbor needs it" >&2
    exit 2
  fi
  echo "setup-harbor: creating $venv with $("$python" --version)"
  "$python" -m venv "$venv"
fi
digest=$(cat pyproject.toml "$constraints" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
  exit 0
fi
echo "setup-harbor: installing osmosis-ai[$extras] into $venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -c "$constraints" -e ".[$extras]"
echo "$digest" > "$stamp"
