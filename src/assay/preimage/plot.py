"""Pictures of preimage approximations (matplotlib, written to PNG files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["plot_result", "plot_grid"]


def _figure():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def plot_result(result, path, samples: int = 20_000, rng=0) -> Path:
    """A 2-D approximation as filled polygons over sampled preimage points; otherwise the ratio over time."""
    from scipy.spatial import ConvexHull

    plt = _figure()
    path = Path(path)
    fig, ax = plt.subplots(figsize=(6, 5))
    if result.region.dim == 2:
        lower, upper = result.region.lower.numpy(), result.region.upper.numpy()
        z = lower + np.random.default_rng(rng).random((samples, 2)) * (upper - lower)
        y = result.region.network.forward(z)
        inside = ((y @ result.C.T + result.d) >= 0).all(1).numpy()
        ax.scatter(*z[inside].T, s=1, c="#999999", label="preimage (samples)")
        colour = "#1f77b4" if result.kind == "under" else "#d62728"
        for number, piece in enumerate(result.pieces):
            corners = _polygon(piece.lower.numpy(), piece.upper.numpy(), piece.A.numpy(), piece.b.numpy())
            if len(corners) >= 3:
                hull = ConvexHull(corners)
                ax.fill(*corners[hull.vertices].T, alpha=0.35, color=colour, edgecolor=colour, linewidth=0.5,
                        label=f"{result.kind}-approximation" if number == 0 else None)
        ax.set_xlim(lower[0], upper[0])
        ax.set_ylim(lower[1], upper[1])
        ax.set_xlabel(f"input {int(result.region.free[0])}")
        ax.set_ylabel(f"input {int(result.region.free[1])}")
        ax.legend(loc="upper right", fontsize=8)
        ax.set_title(f"{result.kind}-approximation: ratio {result.ratio:.3f}, {len(result.pieces)} pieces")
    else:
        seconds = [h[0] for h in result.history]
        ratios = [h[1] for h in result.history]
        ax.plot(seconds, ratios, marker=".")
        ax.axhline(result.threshold, color="#888888", linestyle="--", label=f"threshold {result.threshold:g}")
        ax.set_xlabel("seconds")
        ax.set_ylabel("approximation / preimage volume")
        ax.legend()
        ax.set_title(f"{result.kind}-approximation of a {result.region.dim}-D region: ratio over time")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_grid(grid, image, path) -> Path:
    """The image beside a heat map of the certified share per patch position."""
    plt = _figure()
    path = Path(path)
    image = np.asarray(image, dtype=np.float64)
    shown = image[0] if image.ndim == 3 and image.shape[0] == 1 else (np.moveaxis(image, 0, -1) if image.ndim == 3 else image)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    left.imshow(shown, cmap="gray" if shown.ndim == 2 else None, vmin=0, vmax=1)
    left.set_title(f"image (class {grid.label})")
    heat = right.imshow(grid.covered, cmap="viridis", vmin=0, vmax=1,
                        extent=(grid.lefts[0] - 0.5, grid.lefts[-1] + 0.5, grid.tops[-1] + 0.5, grid.tops[0] - 0.5))
    right.set_title(f"certified share of {grid.size}×{grid.size} patch colourings")
    right.set_xlabel("patch left column")
    right.set_ylabel("patch top row")
    fig.colorbar(heat, ax=right)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _polygon(lower, upper, A, b) -> np.ndarray:
    """Corners of {z ∈ box : A z + b ≥ 0} in 2-D (box corners clipped by each row)."""
    polygon = [np.array(p) for p in ((lower[0], lower[1]), (upper[0], lower[1]), (upper[0], upper[1]), (lower[0], upper[1]))]
    for row, offset in zip(A, b):
        clipped = []
        for i, p in enumerate(polygon):
            q = polygon[(i + 1) % len(polygon)]
            fp, fq = row @ p + offset, row @ q + offset
            if fp >= 0:
                clipped.append(p)
            if (fp >= 0) != (fq >= 0):
                clipped.append(p + fp / (fp - fq) * (q - p))
        polygon = clipped
        if not polygon:
            break
    return np.array(polygon)
