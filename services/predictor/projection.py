"""PCA down-projection of the hashed prompt vectors (Appendix A.4), fitted on the training prompts.

Components are the leading eigenvectors of the covariance of the centred vectors X, found from whichever symmetric
eigenproblem is smaller: XᵀX (d × d) or, with fewer vectors than dimensions, XXᵀ (n × n), whose eigenvectors u give the
components Xᵀu / ‖Xᵀu‖. (Large LAPACK calls are slow in a process where LightGBM's OpenMP threads have run: a d = 512
decomposition took 1.5 s there against 0.06 s in a fresh process.) Each component's sign is fixed so that its
largest-magnitude loading is positive, which makes a fit reproducible whatever sign the linear-algebra library returns.
Directions the vectors do not span (fewer distinct vectors than components) are left as zero components.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_DEGENERATE = 1e-10  # eigenvalues below this fraction of the largest: directions the vectors do not span


@dataclass(frozen=True, slots=True, eq=False)
class Projection:
    mean: np.ndarray  # (d,)
    components: np.ndarray  # (k, d), orthonormal rows

    def __post_init__(self) -> None:
        if self.mean.ndim != 1 or self.components.ndim != 2 or self.components.shape[1] != self.mean.shape[0]:
            raise ValueError(f"projection shapes do not agree: mean {self.mean.shape}, "
                             f"components {self.components.shape}")
        if not (np.isfinite(self.mean).all() and np.isfinite(self.components).all()):
            raise ValueError("projection holds non-finite numbers")

    @property
    def dimensions(self) -> int:
        return int(self.components.shape[0])

    def apply(self, vectors: np.ndarray) -> np.ndarray:
        """(d,) -> (k,) or (n, d) -> (n, k)."""
        return (vectors - self.mean) @ self.components.T

    @staticmethod
    def fit(vectors: np.ndarray, dimensions: int) -> Projection:
        """Principal components of the rows of `vectors` (n, d); needs n > dimensions."""
        if vectors.ndim != 2 or vectors.shape[0] <= dimensions:
            raise ValueError(f"a {dimensions}-component projection needs more than {dimensions} vectors, "
                             f"got {vectors.shape[0]}")
        mean = vectors.mean(axis=0)
        centred = vectors - mean
        few = centred.shape[0] < centred.shape[1]
        values, eigenvectors = np.linalg.eigh(centred @ centred.T if few else centred.T @ centred)  # ascending
        values, eigenvectors = values[::-1][:dimensions], eigenvectors[:, ::-1][:, :dimensions]
        components = (centred.T @ eigenvectors).T if few else eigenvectors.T
        norms = np.linalg.norm(components, axis=1)
        spanned = values > _DEGENERATE * max(values[0], 1e-300)
        components = np.where(spanned[:, None], components / np.where(norms > 0, norms, 1.0)[:, None], 0.0)
        largest = np.abs(components).argmax(axis=1)
        signs = np.sign(components[np.arange(dimensions), largest])
        components *= np.where(signs == 0, 1.0, signs)[:, None]
        return Projection(mean, components)
