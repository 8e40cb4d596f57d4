"""Large, mostly-zero dense layers applied as sparse (CSR) matrix products.

Some networks store huge dense weight matrices that are almost all zeros: the two-level lattice
(TLL) networks of VNN-COMP's tllverifybench have layers of 4,608 × 2,304 weights of which
0.09 % are nonzero. A dense product with such a matrix spends ~1,000 times the work of a sparse
one. :func:`is_sparse_weight` says which matrices are worth the switch (at least
:data:`SPARSE_MIN_WEIGHTS` weights and at most :data:`SPARSE_MAX_DENSITY` of them nonzero);
:func:`sparse_linear` computes ``x Wᵀ (+ b)`` with a CSR ``W``; :class:`SparseLinear` is the
torch module of such a layer (attacks, forward passes).

Results: the products sum exactly the nonzero terms of the dense product (zeros add nothing), in
another order; every rounding bound of the bound engine, stated for a sum of at most ``fan``
products in any order (Higham §3.1), therefore holds for them unchanged.
"""

from __future__ import annotations

import torch

# A matrix is applied sparsely from this many weights on (smaller ones are cheap dense) ...
SPARSE_MIN_WEIGHTS = 65_536
# ... when at most this fraction of them is nonzero (sparse kernels lose to dense ones above a few %).
SPARSE_MAX_DENSITY = 0.02


def is_sparse_weight(weight: torch.Tensor) -> bool:
    """Whether a 2-D weight matrix is large and sparse enough to apply as a CSR product."""
    if weight.dim() != 2 or weight.numel() < SPARSE_MIN_WEIGHTS:
        return False
    return int(torch.count_nonzero(weight)) <= SPARSE_MAX_DENSITY * weight.numel()


def csr_from(rows: torch.Tensor, cols: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A CSR matrix of ``shape`` with ``values`` at (``rows``, ``cols``), given in row-major order."""
    import warnings

    crow = torch.zeros(shape[0] + 1, dtype=torch.int64)
    crow[1:] = torch.bincount(rows, minlength=shape[0]).cumsum(0)
    with warnings.catch_warnings():  # torch calls its CSR support "beta"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, cols, values, shape, dtype=values.dtype)


def nonzeros(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, cols, values) of a 2-D matrix's nonzero entries, in row-major order."""
    rows, cols = weight.detach().nonzero(as_tuple=True)
    return rows, cols, weight.detach()[rows, cols]


def to_csr(weight: torch.Tensor) -> torch.Tensor:
    """The CSR form of a dense 2-D matrix (same dtype, exactly its nonzero values)."""
    return csr_from(*nonzeros(weight), tuple(weight.shape))


def sparse_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x Wᵀ + b`` for a CSR ``weight`` (out, in) and ``x`` of shape (..., in): (..., out).

    Differentiable in ``x`` (and in ``bias``); the weight is a constant.
    """
    lead = x.shape[:-1]
    flat = x.reshape(-1, x.shape[-1])
    y = torch.mm(weight, flat.t()).t()
    if bias is not None:
        y = y + bias
    return y.reshape(*lead, weight.shape[0])


class SparseLinear(torch.nn.Module):
    """``y = x Wᵀ + b`` with ``W`` stored in CSR form: the torch module of a large sparse dense layer.

    ``.to(dtype)`` converts the weight and the bias like any module's buffers.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("weight", to_csr(weight))
        self.register_buffer("bias", None if bias is None else bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sparse_linear(x, self.weight, self.bias)
