"""Fairness certification: :mod:`assay.fairness.knn` certifies KNN decisions against biased training labels."""

from assay.fairness.knn import (
    Certificate,
    Counterexample,
    GroundTruth,
    KnnFairnessCertifier,
    Status,
    certify,
    certify_many,
    ground_truth,
    largest_certified_flips,
)

__all__ = [
    "Certificate",
    "Counterexample",
    "GroundTruth",
    "KnnFairnessCertifier",
    "Status",
    "certify",
    "certify_many",
    "ground_truth",
    "largest_certified_flips",
]
