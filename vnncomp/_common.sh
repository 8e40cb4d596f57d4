# Shared by the VNN-COMP scripts (sourced, not run): the argument checks every script starts with
# and the assay command to call.
#
#   check_arguments USAGE EXPECTED_COUNT "$@"
#
# exits 1 with the competition's message when the version string is not v1 or the count differs.

VERSION_STRING=v1
TOOL_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The assay command: the one install_tool.sh installed, unless $ASSAY names another.
ASSAY="${ASSAY:-$TOOL_DIR/.venv/bin/assay}"

check_arguments() {
    local usage=$1 expected=$2
    shift 2
    if [ "${1:-}" != "$VERSION_STRING" ]; then
        echo "Expected first argument (version string) '$VERSION_STRING', got '${1:-}'" >&2
        exit 1
    fi
    if [ "$#" -ne "$expected" ]; then
        echo "usage: $usage (got $# arguments)" >&2
        exit 1
    fi
}
