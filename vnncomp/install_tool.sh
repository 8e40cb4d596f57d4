#!/usr/bin/env bash
# VNN-COMP tool interface: install assay from this repository.
#
#   install_tool.sh v1
#
# Creates the virtual environment .venv at the repository root and installs assay into it
# (`make install`: pip install -e .), then checks that the `assay` command runs. Needs Python ≥ 3.11
# with venv and make (on Ubuntu: apt-get install python3 python3-venv make). Set PYTHON to pick
# the interpreter (default python3).
set -euo pipefail

VERSION_STRING=v1
if [ "${1:-}" != "$VERSION_STRING" ]; then
    echo "Expected first argument (version string) '$VERSION_STRING', got '${1:-}'" >&2
    exit 1
fi

TOOL_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
echo "Installing assay from $TOOL_DIR"
make -C "$TOOL_DIR" install PYTHON="${PYTHON:-python3}"
"$TOOL_DIR/.venv/bin/assay" --version
