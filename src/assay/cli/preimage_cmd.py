"""``assay preimage``: which inputs of a region does the model map to class K? (PREMAP2)

Three ways to give the input region:

* ``--box "lo1,lo2,...;hi1,hi2,..."``: a box over the model's (flattened) inputs;
* ``--image FILE --patch x,y,w,h``: every colouring of one rectangle of an image (x = left
  column, y = top row; ``--sunbeam`` lets the patch's pixels only brighten);
* ``--image FILE --grid SIZE``: every SIZE×SIZE patch position (explainability): the certified
  share of colourings per position, as a table and a heat map (``--plot``).

Images are ``.npy`` arrays ((C, H, W) or (H, W)) or PNG files, with pixels in [0, 1].
Exit codes: 0 the ratio reached its threshold, 20 it did not (time limit, nothing left to refine),
2 error, 130 Ctrl-C (the approximation reached so far is still printed and plotted).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from assay.cli._common import EXIT_INTERRUPTED, EXIT_UNDECIDED, console, load_network, parse_shape, show_progress
from assay.errors import DataError, OptionError, SpecError

__all__ = ["preimage"]


def preimage(
    model: Path = typer.Argument(..., metavar="MODEL", help="Model file: .onnx or .nnet (optionally .gz)."),
    box: str = typer.Option(None, "--box", help='Input box "lo1,lo2,...;hi1,hi2,..." (one bound per input).'),
    image: Path = typer.Option(None, "--image", help="Image (.npy or .png, pixels in [0, 1]) for --patch or --grid."),
    patch: str = typer.Option(None, "--patch", help="Patch rectangle x,y,w,h: left column, top row, width, height."),
    sunbeam: bool = typer.Option(False, "--sunbeam", help="With --patch: the patch's pixels may only brighten (up to 1)."),
    grid: int = typer.Option(None, "--grid", help="With --image: certify every SIZE×SIZE patch position (heat map)."),
    stride: int = typer.Option(1, "--stride", help="With --grid: step between patch positions."),
    argmax: int = typer.Option(None, "--argmax", help="The output class K (the region is argmax = K). Default with "
                               "--image: the model's prediction on the image."),
    under: bool = typer.Option(True, "--under/--over", help="Under-approximation (every point provably maps to K) or "
                               "over-approximation (every point that maps to K is provably inside)."),
    threshold: float = typer.Option(None, "--threshold", help="Target volume ratio (default 0.9 under, 1.1 over)."),
    time_limit: float = typer.Option(60.0, "--time-limit", help="Seconds (per patch position with --grid); the "
                                     "approximation reached by then is reported."),
    samples: int = typer.Option(2000, "--samples", help="Uniform samples per piece for the volume estimates."),
    method: str = typer.Option("alpha", "--method", help="Bounds of each piece: alpha (α-CROWN maximising the "
                               "covered volume, as in PREMAP) or crown (faster, looser)."),
    branching: str = typer.Option("auto", "--branching", help="What refinement splits: input (the free inputs: "
                                  "boxes), relu (ReLU activation states) or auto (input up to 8 free inputs, else relu)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the samples."),
    input_shape: str = typer.Option(None, "--input-shape", help="Input shape without batch, e.g. 1,8,8, when the "
                                    "model file leaves dimensions open."),
    plot: Path = typer.Option(None, "--plot", help="Write a PNG: the pieces (2-D regions), the ratio over time, or the "
                              "heat map (--grid)."),
    json_output: bool = typer.Option(False, "--json", help="Print the full result as JSON (every piece's box, A, b, "
                                     "volumes: membership can be checked without assay)."),
) -> None:
    """Approximate the inputs of a box or an image patch that the model maps to class K, with volume guarantees."""
    import torch

    network = load_network(model, parse_shape(input_shape))
    kind = "under" if under else "over"
    if method not in ("alpha", "crown"):
        raise OptionError(f"--method must be alpha or crown; got {method!r}")
    if branching not in ("auto", "input", "relu"):
        raise OptionError(f"--branching must be auto, input or relu; got {branching!r}")
    if (box is None) == (image is None):
        raise OptionError("give the input region with exactly one of --box or --image (with --patch or --grid)")
    if image is not None and (patch is None) == (grid is None):
        raise OptionError("--image needs exactly one of --patch x,y,w,h or --grid SIZE")
    if box is not None and (patch or grid or sunbeam):
        raise OptionError("--patch, --grid and --sunbeam go with --image, not with --box")
    if argmax is not None and not 0 <= argmax < network.output_size:
        raise SpecError(f"--argmax {argmax} is not a class of {model} (it has {network.output_size} outputs: "
                        f"0…{network.output_size - 1})")
    pixels = _read_image(image, network) if image is not None else None
    if argmax is None:
        if pixels is None:
            raise OptionError("--argmax K is needed with --box (the output class whose preimage is approximated)")
        argmax = int(network.forward(pixels.reshape(network.input_shape)).reshape(-1).argmax())
    if grid is not None:
        _grid(network, pixels, grid, stride, argmax, threshold, time_limit, samples, method, branching, seed, plot,
              json_output)
        return

    from assay.preimage import approximate_preimage
    from assay.sets import argmax_is, patch_region, sunbeam_region

    if box is not None:
        lower, upper = _parse_box(box, network.input_size)
        region = (lower.reshape(network.input_shape), upper.reshape(network.input_shape))
    else:
        x, y, w, h = _parse_patch(patch)
        shaped = pixels if pixels.dim() == 3 else pixels.unsqueeze(0)
        if sunbeam:
            mask = torch.zeros(shaped.shape[-2:], dtype=torch.bool)
            patch_region(shaped, y, x, h, w)  # validates the rectangle with a clear message
            mask[y:y + h, x:x + w] = True
            found = sunbeam_region(shaped, mask)
        else:
            found = patch_region(shaped, y, x, h, w)
        region = (found.lower.reshape(network.input_shape), found.upper.reshape(network.input_shape))
    result = _run(approximate_preimage, network, region, argmax_is(argmax, network.output_size), kind, threshold,
                  time_limit, samples, method, branching, seed, json_output)
    if plot is not None:
        from assay.preimage.plot import plot_result

        plot_result(result, plot)
    if json_output:
        typer.echo(json.dumps(result.to_json() | {"argmax": argmax}, indent=1))
    else:
        _print(result, argmax, plot)
    if result.status == "interrupted":
        raise typer.Exit(EXIT_INTERRUPTED)
    if result.status != "reached":
        raise typer.Exit(EXIT_UNDECIDED)


def _run(approximate, network, region, spec, kind, threshold, time_limit, samples, method, branching, seed, json_output):
    options = dict(kind=kind, threshold=threshold, time_limit=time_limit, samples=samples, method=method,
                   branching=branching, rng=seed)
    if not show_progress(json_output):
        return approximate(network, region, spec, **options)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    target = threshold if threshold is not None else (0.9 if kind == "under" else 1.1)
    columns = (TextColumn(f"{kind}-approximation"), BarColumn(), TextColumn("{task.fields[text]}"), TimeElapsedColumn())
    with Progress(*columns, console=None, transient=True) as bar:
        task = bar.add_task("", total=1.0, text="")

        def report(state):
            ratio = state["ratio"]
            done = ratio / target if kind == "under" else (target - 1) / max(ratio - 1, target - 1) if ratio < float("inf") else 0
            bar.update(task, completed=min(done, 1.0), text=f"ratio {ratio:.3f} (target {target:g}), {state['pieces']} pieces")

        return approximate(network, region, spec, progress=report, **options)


def _print(result, argmax: int, plot) -> None:
    out = console()
    pre, approx = result.preimage_volume, result.approximation_volume
    low, high = result.ratio_interval
    relation = "inside" if result.kind == "under" else "around"
    out.print(f"{result.kind}-approximation of the inputs mapped to class {argmax}: {len(result.pieces)} polytopes {relation} "
              f"the preimage, over {result.region.dim} free inputs.")
    out.print(f"  ratio {result.ratio:.4f} (interval {low:.4f}–{high:.4f} at {result.confidence:.0%}; target "
              f"{result.threshold:g}): [bold]{result.status}[/bold] after {result.iterations} rounds, {result.seconds:.2f} s")
    share = 100 / result.region_volume
    out.print(f"  preimage {pre.value * share:.2f}% of the region (±{(pre.high - pre.low) / 2 * share:.2f}), "
              f"approximation {approx.value * share:.2f}% (±{(approx.high - approx.low) / 2 * share:.2f})")
    if result.check is not None:
        check = result.check
        low, high = check["ratio_interval"]
        out.print(f"  checked on {check['samples']:,} fresh samples of the region: ratio {check['ratio']:.4f} "
                  f"(exact interval {low:.4f}–{high:.4f}), no sample contradicts the approximation")
    if plot is not None:
        out.print(f"  plot written to {plot}")


def _grid(network, pixels, size, stride, label, threshold, time_limit, samples, method, branching, seed, plot,
          json_output):
    from assay.preimage.grid import patch_grid

    options = dict(label=label, stride=stride, threshold=0.9 if threshold is None else threshold,
                   time_limit=time_limit, samples=samples, method=method, branching=branching, rng=seed)
    if show_progress(json_output):
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task("patch positions", total=None)
            found = patch_grid(network, pixels, size, progress=lambda done, total: bar.update(task, completed=done, total=total),
                               **options)
    else:
        found = patch_grid(network, pixels, size, **options)
    if plot is not None:
        from assay.preimage.plot import plot_grid

        plot_grid(found, pixels.numpy(), plot)
    if json_output:
        typer.echo(json.dumps(found.to_json(), indent=1))
        return
    out = console()
    out.print(f"Certified share of {size}×{size} patch colourings that keep class {label}, per patch position "
              f"(rows: top, columns: left; {found.seconds:.1f} s):")
    out.print("      " + " ".join(f"{left:>5}" for left in found.lefts))
    for r, top in enumerate(found.tops):
        out.print(f"{top:>5} " + " ".join(f"{value:5.2f}" for value in found.covered[r]))
    if plot is not None:
        out.print(f"heat map written to {plot}")


def _parse_box(text: str, size: int):
    import torch

    parts = text.split(";")
    if len(parts) != 2:
        raise OptionError(f'--box takes "lo1,lo2,...;hi1,hi2,..." (lower bounds; upper bounds); got {text!r}')
    try:
        lower, upper = ([float(v) for v in part.split(",") if v.strip()] for part in parts)
    except ValueError:
        raise OptionError(f"--box takes numbers; got {text!r}") from None
    if len(lower) != size or len(upper) != size:
        raise SpecError(f"--box gives {len(lower)} lower and {len(upper)} upper bounds, but the model has {size} inputs; "
                        "give one of each per input")
    return torch.tensor(lower, dtype=torch.float64), torch.tensor(upper, dtype=torch.float64)


def _parse_patch(text: str) -> tuple[int, int, int, int]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 4:
        raise OptionError(f"--patch takes x,y,w,h (left column, top row, width, height) as four integers; got {text!r}")
    return values


def _read_image(path: Path, network):
    import numpy as np
    import torch

    if not path.is_file():
        raise DataError(f"{path}: no such image file")
    if path.suffix.lower() == ".npy":
        try:
            array = np.load(path)
        except (ValueError, OSError) as exc:
            raise DataError(f"{path}: not a readable .npy array ({exc})") from None
    elif path.suffix.lower() == ".png":
        import matplotlib.image

        array = matplotlib.image.imread(path)  # floats in [0, 1] for PNG
        array = np.moveaxis(array[..., :3], -1, 0) if array.ndim == 3 else array
    else:
        raise DataError(f"{path}: images are .npy arrays or .png files")
    array = np.asarray(array, dtype=np.float64)
    if np.isnan(array).any() or array.min() < 0 or array.max() > 1:
        raise DataError(f"{path}: pixels must be numbers in [0, 1]; rescale the image")
    if array.size != network.input_size:
        raise DataError(f"{path}: the image has {array.size} pixel values (shape {array.shape}), but the model takes "
                        f"{network.input_size} inputs (shape {network.input_shape})")
    if array.ndim == 1:
        array = array.reshape(network.input_shape if len(network.input_shape) > 1 else (1, -1))
    return torch.as_tensor(array)
