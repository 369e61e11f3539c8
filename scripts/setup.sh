#!/usr/bin/env bash
# Create or refresh .venv with the project and the extras named in $OSMOSIS_EXTRAS.
# Skips the install when pyproject.toml has not changed since the last successful one.
set -euo pipefail
cd "$(dirname "$0")/.."

extras="${OSMOSIS_EXTRAS:-dev}"
python="${PYTHON:-python3}"
venv=".venv"
stamp="$venv/.osmosis-setup-$(echo "$extras" | tr ',' '-')"

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv with $($python --version)"
  "$python" -m venv "$venv"
fi
digest=$(cat pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
  exit 0
fi
echo "setup: installing osmosis-ai[$extras] into $venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e ".[$extras]"
echo "$digest" > "$stamp"
