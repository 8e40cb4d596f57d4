"""Loading the CertiFair decision streams (the Clemont paper's Table 1) straight from their zip."""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path

import numpy as np


def certifair_names(data_dir: Path, datasets=("german", "compas")) -> list[str]:
    with zipfile.ZipFile(data_dir / "monitor" / "certifair_predictions.zip") as archive:
        names = sorted(n for n in archive.namelist() if n.endswith(".csv"))
    return [n for n in names if Path(n).name.split("-")[0] in datasets]


def load_certifair(data_dir: Path, member: str) -> tuple[np.ndarray, np.ndarray]:
    """Features (n, d) float64 and predictions (n,) of one stream; the ground-truth label is dropped."""
    with zipfile.ZipFile(data_dir / "monitor" / "certifair_predictions.zip") as archive:
        text = archive.read(member).decode("utf-8")
    rows = list(csv.reader(io.StringIO(text)))
    header, body = rows[0], np.array(rows[1:], dtype=np.float64)
    features = [i for i, c in enumerate(header) if c not in ("prediction", "label")]
    return body[:, features], body[:, header.index("prediction")]


def oracle_pairs_linf(X: np.ndarray, Y: np.ndarray, epsilon: float, block: int = 512):
    """All (later, earlier) pairs with max|x_i − x_j| ≤ ε and different predictions, by blocks of the full matrix."""
    later, earlier = [], []
    for start in range(0, X.shape[0], block):
        rows = X[start : start + block]
        d = np.abs(rows[:, None, :] - X[None, : start + block, :]).max(axis=2)
        i, j = np.nonzero(d <= epsilon)
        i = i + start
        keep = (j < i) & (Y[i] != Y[j])
        later.append(i[keep])
        earlier.append(j[keep])
    return np.concatenate(later), np.concatenate(earlier)
