"""The PCA projection of the hashing vectors: it finds the main directions, reproducibly, and checks its inputs."""

from __future__ import annotations

import numpy as np
import pytest

from bear.predictor.projection import Projection


def test_the_first_component_is_the_direction_of_most_variance() -> None:
    rng = np.random.default_rng(1)
    direction = np.zeros(32)
    direction[3], direction[7] = 0.6, -0.8
    vectors = rng.normal(size=(500, 1)) * 10 * direction + rng.normal(size=(500, 32)) * 0.1 + 5.0
    projection = Projection.fit(vectors, 4)
    assert abs(projection.components[0] @ direction) == pytest.approx(1.0, abs=1e-3)
    assert np.allclose(projection.components @ projection.components.T, np.eye(4), atol=1e-10)
    assert projection.apply(vectors).shape == (500, 4) and projection.apply(vectors[0]).shape == (4,)
    assert np.allclose(projection.apply(vectors).mean(axis=0), 0.0, atol=1e-9)


def test_signs_are_fixed_so_a_fit_is_reproducible() -> None:
    vectors = np.random.default_rng(2).normal(size=(60, 16))
    a, b = Projection.fit(vectors, 5), Projection.fit(-vectors, 5)
    largest = np.abs(a.components).argmax(axis=1)
    assert (a.components[np.arange(5), largest] > 0).all()
    assert np.allclose(np.abs(a.components), np.abs(b.components))
    assert (b.components[np.arange(5), np.abs(b.components).argmax(axis=1)] > 0).all()


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="needs more than 16 vectors, got 10"):
        Projection.fit(np.zeros((10, 512)), 16)
    with pytest.raises(ValueError, match="shapes do not agree"):
        Projection(np.zeros(8), np.zeros((2, 9)))
    with pytest.raises(ValueError, match="non-finite"):
        Projection(np.full(3, np.nan), np.zeros((1, 3)))


def test_few_vectors_use_the_small_eigenproblem_with_the_same_components() -> None:
    rng = np.random.default_rng(6)
    vectors = rng.normal(size=(40, 8)) @ rng.normal(size=(8, 64)) + rng.normal(size=(40, 64)) * 0.01
    few = Projection.fit(vectors, 5)  # 40 vectors < 64 dimensions: the 40 × 40 problem
    many = Projection.fit(np.vstack([vectors, vectors]), 5)  # 80 vectors: the 64 × 64 problem, same covariance
    assert np.allclose(few.components, many.components, atol=1e-8)


def test_directions_the_vectors_do_not_span_are_zero() -> None:
    base = np.random.default_rng(7).normal(size=(3, 32))
    projection = Projection.fit(np.vstack([base] * 6), 4)  # 3 distinct vectors span 2 centred directions
    norms = np.linalg.norm(projection.components, axis=1)
    assert np.allclose(norms, [1, 1, 0, 0])
