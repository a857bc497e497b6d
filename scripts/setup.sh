#!/usr/bin/env bash
# Set up polyspec in ./.venv and fetch the embedded offline assets. Safe to run again: a second
# run reinstalls nothing unless pyproject.toml or this script changed, and fetches nothing present.
#   --no-assets   skip fetching the embedded verifier, tokenizers and texts
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: polyspec needs Python 3.11 or newer ($python is older); set PYTHON=..." >&2
  exit 2
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv

stamp=.venv/.polyspec-installed
wanted=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  # torch is pinned here, not in pyproject: an unpinned torch resolves to a multi-GB GPU build.
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[assets,bench,train,serve,dev]"
  echo "$wanted" > "$stamp"
fi

if [ "${1:-}" != "--no-assets" ]; then
  .venv/bin/polyspec assets fetch
fi
