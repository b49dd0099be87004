#!/usr/bin/env bash
# The Python package's suite: a private venv with the pinned maturin and pytest, the wheel
# built by `pip wheel ./bindings/python` (maturin as the PEP 517 backend, as a user's pip
# install builds it), installed into the venv, pdrouter-mock and pdrouter built (debug), then
# pytest over bindings/python/tests. Extra arguments go to pytest.
#
# Build time: a wheel is a release build by default (6-8 minutes for the router here). CI
# only needs a working wheel, so this script asks maturin for the dev profile
# (MATURIN_PEP517_ARGS, read by maturin's PEP 517 backend): the router's debug build, which CI
# has already compiled for cargo test, is reused and only the extension is built and linked.
# Published wheels are built without it (release profile). PDROUTER_WHEEL_PROFILE=release
# here builds the release wheel instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

PY="${PYTHON:-python3}"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
VENV="${PDROUTER_PY_VENV:-$TARGET/python-venv}"
WHEEL_DIR="$TARGET/python-wheel"
PROFILE="${PDROUTER_WHEEL_PROFILE:-dev}"

if ! command -v "$PY" >/dev/null 2>&1; then
    echo "python: $PY not found; install Python 3.9 or newer" >&2
    exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PY" -m venv "$VENV"; then
        echo "python: '$PY -m venv' failed; install the venv module (Debian: apt-get install python3-venv)" >&2
        rm -rf "$VENV"
        exit 1
    fi
fi
if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
    -r bindings/python/requirements-test.txt; then
    echo "python: cannot install bindings/python/requirements-test.txt from the package registry" >&2
    exit 1
fi

rm -rf "$WHEEL_DIR"
mkdir -p "$WHEEL_DIR"
if [ "$PROFILE" != release ]; then
    export MATURIN_PEP517_ARGS="--profile $PROFILE"
fi
# pip's build isolation fetches maturin itself: this is the path a user's pip takes.
if ! "$VENV/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps \
    ./bindings/python -w "$WHEEL_DIR"; then
    echo "python: 'pip wheel ./bindings/python' failed: the package does not build" >&2
    exit 1
fi
unset MATURIN_PEP517_ARGS
wheel=$(ls "$WHEEL_DIR"/pdrouter-*.whl)
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"

cargo build -q -p pdrouter -p pdrouter-mock --bins
export PDROUTER_BIN="$TARGET/debug/pdrouter"
export PDROUTER_MOCK_BIN="$TARGET/debug/pdrouter-mock"
export PDROUTER_WHEEL_DIR="$WHEEL_DIR"
# From the tests' folder, so `import pdrouter` is the installed wheel, never the source tree.
cd bindings/python/tests
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
