#!/usr/bin/env bash
# VNN-COMP tool interface: verify one instance and write the result file.
#
#   run_instance.sh v1 BENCHMARK ONNX VNNLIB RESULT_FILE TIMEOUT
#
# RESULT_FILE gets one word on its first line: unsat (the property holds), sat (violated; the
# counterexample follows as ((X_0 v) ... (Y_0 v) ...), re-checked by a forward pass), timeout,
# unknown or error. A model assay cannot load or bound soundly (an unsupported operator) gives
# error, with the one-line reason on stderr. The timeout counts from the start of `assay verify`
# (Python start-up and loading included). The script exits 0 whenever RESULT_FILE was written,
# so that the competition reads the verdict from it.
set -uo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
check_arguments "run_instance.sh v1 BENCHMARK ONNX VNNLIB RESULT_FILE TIMEOUT" 6 "$@"

CATEGORY=$2
ONNX_FILE=$3
VNNLIB_FILE=$4
RESULT_FILE=$5
TIMEOUT=$6

echo "Running assay on benchmark '$CATEGORY': onnx '$ONNX_FILE', vnnlib '$VNNLIB_FILE', result file '$RESULT_FILE', timeout $TIMEOUT s"
rm -f "$RESULT_FILE"

# assay answers within about TIMEOUT seconds by itself; this outer limit only catches a run that
# hangs (it then counts as a timeout), a little after the competition would stop waiting.
GRACE=${ASSAY_TIMEOUT_GRACE:-30}
LIMIT=$(awk -v t="$TIMEOUT" -v g="$GRACE" 'BEGIN { printf "%d", t + g + 1 }')
STARTED=$(date +%s)
timeout --signal=TERM --kill-after=5 "$LIMIT" \
    "$ASSAY" verify "$ONNX_FILE" "$VNNLIB_FILE" --timeout "$TIMEOUT" --result-file "$RESULT_FILE"
CODE=$?
ELAPSED=$(( $(date +%s) - STARTED ))

if [ ! -f "$RESULT_FILE" ]; then
    if { [ "$CODE" -eq 124 ] || [ "$CODE" -eq 137 ]; } && [ "$ELAPSED" -ge "$LIMIT" ]; then
        echo "assay did not stop within $LIMIT s; recording timeout" >&2
        echo "timeout" > "$RESULT_FILE"
    elif [ "$CODE" -eq 137 ]; then
        echo "assay verify was killed after $ELAPSED s (out of memory?); recording error" >&2
        echo "error" > "$RESULT_FILE"
    else
        # A crash or a bad option: assay has said why on stderr.
        echo "assay verify stopped with exit code $CODE before writing a result; recording error" >&2
        echo "error" > "$RESULT_FILE"
    fi
fi
echo "Result: $(head -n 1 "$RESULT_FILE")"
exit 0
