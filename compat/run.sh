#!/usr/bin/env bash
# The OpenAI-SDK compatibility suite: builds pdrouter and pdrouter-mock, makes a virtualenv with
# the pinned `openai` and `pytest` from the package registry, and runs compat/python against
# routers and mocks it starts on loopback. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${COMPAT_VENV:-target/compat-venv}"
PY="${PYTHON:-python3}"

if ! command -v "$PY" >/dev/null 2>&1; then
    echo "compat: $PY not found; install Python 3.9 or newer" >&2
    exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PY" -m venv "$VENV"; then
        echo "compat: '$PY -m venv' failed; install the venv module (Debian: apt-get install python3-venv)" >&2
        rm -rf "$VENV"
        exit 1
    fi
fi
if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r compat/python/requirements.txt; then
    echo "compat: cannot install compat/python/requirements.txt from the package registry" >&2
    exit 1
fi

cargo build -q -p pdrouter -p pdrouter-mock --bins
export PDROUTER_BIN="$PWD/target/debug/pdrouter"
export PDROUTER_MOCK_BIN="$PWD/target/debug/pdrouter-mock"
cd compat/python
exec "../../$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
