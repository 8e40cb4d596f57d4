"""Which networks of ``vnncomp2024/`` assay loads, and how far their forward pass is from onnxruntime.

For every network of every benchmark in ``$ASSAY_DATA/vnncomp2024`` (or ``../shared/data``):
load it with :func:`assay.nn.load`; draw ``--samples`` inputs uniformly from the input box of the
network's first property in ``instances.csv``; compare the float64 forward pass with onnxruntime
(:func:`assay.nn.reference.deviation_from_onnxruntime`: onnxruntime on a float64 copy of the
model where it has double kernels, else on the float32 model). A network passes when the largest
deviation is at most ``1e-5 · max(1, max |output|)``. Writes
``benchmarks/results/vnncomp2024_loading.json`` and ``.md`` (the per-benchmark table of the README)
and exits 1 if a loaded network deviates.

    .venv/bin/python benchmarks/vnncomp2024_loading.py [--samples 100] [--only nn4sys] [--readme]

``--readme`` also writes the table into README.md, between its ``vnncomp2024-loading-table`` markers.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import data_dir, machine, markdown_table, write_readme_block, write_results  # noqa: E402

from assay.errors import AssayError  # noqa: E402
from assay.nn import load  # noqa: E402
from assay.nn._onnx import SUPPORTED_OPERATORS, operator_counts  # noqa: E402
from assay.nn.reference import deviation_from_onnxruntime  # noqa: E402
from assay.sets import read_vnnlib  # noqa: E402

TOLERANCE = 1e-5
# computed on constants only in the 2024 graphs, which the loader folds away (see assay.nn._onnx_fold)
FOLDED = {"Shape", "ConstantOfShape", "Expand", "Range", "Equal", "Where", "Cast"}


def first_properties(folder: Path) -> dict[str, Path]:
    """network path (relative, as instances.csv names it) → its first property's path."""
    found: dict[str, Path] = {}
    with open(folder / "instances.csv", newline="") as handle:
        for row in csv.reader(handle):
            if len(row) >= 2 and row[0].strip():
                network = row[0].strip().removeprefix("./")
                found.setdefault(network, folder / row[1].strip().removeprefix("./"))
    return found


def check_network(path: Path, prop: Path | None, samples: int, rng: np.random.Generator) -> dict:
    import onnx

    started = time.perf_counter()
    try:
        network = load(path)
    except AssayError as exc:
        # the operators of the file that assay neither loads nor folds away (the first one the
        # loader met is named in "error")
        unsupported = [op for op in operator_counts(path) if op not in SUPPORTED_OPERATORS and op not in FOLDED]
        return {"loaded": False, "error": f"{type(exc).__name__}: {exc}".replace(str(path) + ": ", ""),
                "unsupported": unsupported or [str(exc).split("uses operator ")[-1].split(",")[0]]}
    load_seconds = time.perf_counter() - started
    if prop is None:
        low, high = -np.ones(network.input_size), np.ones(network.input_size)
        box_from = "[-1, 1] (no property)"
    else:
        box = read_vnnlib(prop, num_inputs=network.input_size).queries[0].input_set
        low, high, box_from = box.lower.numpy(), box.upper.numpy(), prop.name
    x = rng.uniform(low, high, size=(samples, network.input_size)).reshape(samples, *network.input_shape)
    model = onnx.load_model_from_string(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else
                                        path.read_bytes())
    deviation = deviation_from_onnxruntime(network, model, x)
    return {"loaded": True, "layers": len(network.layers), "input_shape": list(network.input_shape),
            "output_shape": list(network.output_shape), "box": box_from, "load_seconds": round(load_seconds, 2),
            **deviation, "matches": deviation["relative"] <= TOLERANCE}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--only", default="", help="only benchmarks whose folder name contains this")
    parser.add_argument("--readme", action="store_true", help="write the table into README.md")
    args = parser.parse_args()
    root = data_dir() / "vnncomp2024"
    rng = np.random.default_rng(0)
    results, rows, failures = {}, [], []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and args.only in p.name):
        props = first_properties(folder)
        networks = sorted(p for p in (folder / "onnx").rglob("*.onnx*"))
        per_network = {}
        for path in networks:
            relative = str(path.relative_to(folder))
            per_network[relative] = result = check_network(path, props.get(relative), args.samples, rng)
            status = "ok" if result.get("matches") else ("DEVIATES" if result["loaded"] else "not loaded")
            print(f"{folder.name}/{relative}: {status} {result.get('relative', result.get('error', ''))!s:.160}",
                  flush=True)
            if result["loaded"] and not result["matches"]:
                failures.append(f"{folder.name}/{relative}")
        results[folder.name] = per_network
        loaded = [r for r in per_network.values() if r["loaded"]]
        reasons = sorted({reason for r in per_network.values() if not r["loaded"] for reason in r["unsupported"]})
        worst = max((r["relative"] for r in loaded), default=None)
        rows.append([folder.name, f"{len(loaded)}/{len(per_network)}",
                     f"{sum(r['matches'] for r in loaded)}/{len(loaded)}",
                     "—" if worst is None else f"{worst:.1e}",
                     ", ".join(sorted({r["reference"] for r in loaded})) or "—",
                     "; ".join(reasons) or "—"])
    table = markdown_table(["benchmark", "loaded / networks", "match onnxruntime", "largest deviation (relative)",
                            "onnxruntime reference", "not loaded: operators outside the supported list"], rows)
    table += (f"\n{args.samples} inputs per network, uniform in the first property's input box; deviation = "
              "max |assay float64 − onnxruntime| / max(1, max |onnxruntime output|), tolerance 1e-5.\n")
    write_results("vnncomp2024_loading", {"machine": machine(), "samples": args.samples, "tolerance": TOLERANCE,
                                          "networks": results}, table)
    print(table)
    if args.readme:
        write_readme_block("vnncomp2024-loading-table", "vnncomp2024_loading.py", table)
    if failures:
        print("DEVIATES from onnxruntime: " + ", ".join(failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
