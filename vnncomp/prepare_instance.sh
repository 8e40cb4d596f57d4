#!/usr/bin/env bash
# VNN-COMP tool interface: prepare one instance (no analysis happens here).
#
#   prepare_instance.sh v1 BENCHMARK ONNX VNNLIB
#
# Checks that assay is installed and that the model and property files exist. assay reads
# gzipped files (.onnx.gz, .vnnlib.gz) as they are, so nothing is converted. Settings do not
# depend on the benchmark.
set -uo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
check_arguments "prepare_instance.sh v1 BENCHMARK ONNX VNNLIB" 4 "$@"

CATEGORY=$2
ONNX_FILE=$3
VNNLIB_FILE=$4

echo "Preparing assay for benchmark '$CATEGORY': onnx '$ONNX_FILE', vnnlib '$VNNLIB_FILE'"
if [ ! -x "$ASSAY" ]; then
    echo "assay is not installed at $ASSAY: run vnncomp/install_tool.sh v1 first (or set ASSAY)" >&2
    exit 1
fi
for file in "$ONNX_FILE" "$VNNLIB_FILE"; do
    if [ ! -f "$file" ]; then
        echo "no such file: $file" >&2
        exit 1
    fi
done
exit 0
