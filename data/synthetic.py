"""Synthetic generators of the papers."""

from __future__ import annotations

import numpy as np


def romano2019(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Paper 000 section 5.1 (after Romano et al. 2019), with outliers.

    X ~ U[1, 5];  Y | X ~ Pois(sin^2(X) + 0.1) + 0.03 X eps_1 + 25 * 1{U < 0.01} eps_2,
    eps_1, eps_2 standard Gaussian, U uniform on [0, 1].
    """
    x = rng.uniform(1.0, 5.0, n)
    y = (rng.poisson(np.sin(x) ** 2 + 0.1)
         + 0.03 * x * rng.standard_normal(n)
         + 25.0 * (rng.uniform(size=n) < 0.01) * rng.standard_normal(n))
    return x[:, None], y


def paper004_shift(n: int, rng: np.random.Generator, delta: float = 0.5,
                   exact_groups: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Paper 004 section 4.6, one centre: control x = eps, treatment y = eps + delta, eps ~ N(0, 1).

    Returned as (group indicator, value); centre effects alpha_l and beta_l come from the
    scenario's heterogeneity (per-site location shifts), as in the paper's model. Each value's
    group is drawn with probability 1/2; with exact_groups, n // 2 controls and n - n // 2
    treatments in random order, and the harness gives every site exactly half its n_j of each
    (table 1's n_l per group: data.split.group_partition).
    """
    if exact_groups:
        group = rng.permutation(np.arange(n) >= n // 2).astype(float)
    else:
        group = rng.integers(0, 2, n).astype(float)
    return group[:, None], rng.standard_normal(n) + delta * group


def paper004_gamma(n: int, rng: np.random.Generator, shape: float = 4.0) -> tuple[np.ndarray, np.ndarray]:
    """Paper 004 section 5.4, one centre: x = eps, eps ~ Gamma(r, 1) with r = 4 (the scale factor
    exp(alpha_l) of each centre comes from the scenario's heterogeneity, per-site scale shifts).
    The single feature is an uninformative constant."""
    return np.zeros((n, 1)), rng.gamma(shape, 1.0, n)


def paper001_uniform(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Paper 001 section 4: one scalar per client, Unif([0, B]) with B = 10 (constant feature)."""
    return np.zeros((n, 1)), rng.uniform(0.0, 10.0, n)


def paper001_chi2(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Paper 001 section 4: one scalar per client, chi^2(4) clipped to [0, B] with B = 10."""
    return np.zeros((n, 1)), np.clip(rng.chisquare(4.0, n), 0.0, 10.0)


def classification_blobs(n: int, rng: np.random.Generator, classes: int = 10, features: int = 20,
                         clusters: int = 3, separation: float = 0.6, layout_seed: int = 0):
    """Labelled points for federated learning curves (paper 002's experiments use image sets; this is
    a synthetic stand-in of any size): each class owns `clusters` Gaussian blobs, x = c + N(0, I),
    the centres c ~ N(0, separation^2 I) in R^features. Several blobs per class make the classes
    not linearly separable, so wider and deeper networks learn more. The centres come from
    `layout_seed`, not from rng, so that every call (training data, a separate test set) draws
    from the same distribution. Labels are 0 .. classes - 1 (as floats)."""
    classes, features, clusters = int(classes), int(features), int(clusters)
    if classes < 2 or features < 1 or clusters < 1:
        raise ValueError(f"classification_blobs needs classes >= 2, features >= 1, clusters >= 1; got {classes}, "
                         f"{features}, {clusters}")
    centres = np.random.default_rng(int(layout_seed)).normal(0.0, separation, (classes * clusters, features))
    blob = rng.integers(0, classes * clusters, n)
    return centres[blob] + rng.standard_normal((n, features)), (blob % classes).astype(float)


def paper001_label_shift(n: int, rng: np.random.Generator, random_state: int = 2345):
    """Paper 001 appendix B.3's pool: scikit-learn's make_classification with the paper's
    arguments (n_samples 5e5 in the paper; 20 features, 15 informative, 2 redundant, 10 classes,
    one cluster per class, class_sep 5.0, hypercube False) and the paper's random_state 2345, so
    the class means are the paper's polytope; `rng` is unused (the pool is fixed by random_state;
    the label shift across clients comes from sites.heterogeneity: dirichlet with held_out)."""
    from sklearn.datasets import make_classification

    X, y = make_classification(n_samples=int(n), n_features=20, n_informative=15, n_redundant=2, n_repeated=0,
                               n_classes=10, n_clusters_per_class=1, class_sep=5.0, hypercube=False,
                               random_state=int(random_state))
    return X, y.astype(float)


GENERATORS = {"romano2019": romano2019, "paper004_shift": paper004_shift, "paper004_gamma": paper004_gamma,
              "paper001_uniform": paper001_uniform, "paper001_chi2": paper001_chi2, "classification_blobs": classification_blobs,
              "paper001_label_shift": paper001_label_shift}
#: generators whose labels are classes (the others give a regression response)
CLASSIFICATION_GENERATORS = {"classification_blobs", "paper001_label_shift"}
