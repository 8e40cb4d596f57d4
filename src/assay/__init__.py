"""assay: certify and monitor the robustness and fairness of machine-learning models."""

from assay.errors import AssayError

__version__ = "0.1.0"

__all__ = ["AssayError", "__version__"]
