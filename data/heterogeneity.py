"""How calibration data differ from site to site (scenario `sites.heterogeneity`).

  none       a random partition (exchangeable sites: paper 000's theorem 3.2 holds)
  sort       covariate shift: sites take consecutive blocks after sorting on a feature
  response   response shift: the same, sorting on the response
  cluster    covariate shift: sorting on k-means cluster labels (k = number of sites)
  location   paper 004 section 4.6: each site's responses shifted by alpha_j ~ N(0, sigma^2);
             with sigma_treatment > 0, its treatment group (two_sample data) also by
             beta_j - delta ~ N(0, sigma_treatment^2) (the paper's sigma_beta)
  scale      paper 004 section 5.4: each site's responses multiplied by exp(alpha_j)
  dirichlet  label skew (classification): site j's class mix ~ Dirichlet(concentration); the
             last `held_out` sites (in site order) draw theirs from
             Dirichlet(held_out_concentration) instead (paper 001 appendix B.3: training clients
             at 0.5, validation and test clients at 0.01)

For sort, response and cluster, `strength` in [0, 1] blends the sorting key with noise:
1 sorts fully, 0 is a random partition; when the sites hold fewer points than the calibration
split, a random subset of the right size is sorted, so the blocks span the key's whole range. Shifts apply to the sites' calibration data only; the
test set stays unshifted (the reference distribution of paper 000's proposition 3.4).
"""

from __future__ import annotations

import numpy as np

from data.split import check_capacity, group_partition, partition

KINDS = ("none", "sort", "response", "cluster", "location", "scale", "dirichlet")
HETEROGENEITY_FIELDS = {
    "kind": {"type": "str", "choices": list(KINDS), "default": "none"},
    "feature": {"type": "int", "min": 0, "default": 0},
    "strength": {"type": "float", "ge": 0, "le": 1, "default": 1.0},
    "sigma": {"type": "float", "ge": 0, "default": 0.5},
    "concentration": {"type": "float", "gt": 0, "default": 0.5},
    "sigma_treatment": {"type": "float", "ge": 0, "default": 0.0},
    "held_out": {"type": "int", "min": 0, "default": 0},
    "held_out_concentration": {"type": "float", "gt": 0, "default": 0.01},
}


def assign_sites(spec: dict, X: np.ndarray, y: np.ndarray, sizes: list[int], rng: np.random.Generator,
                 exact_groups: bool = False):
    """Index arrays (into X, y) of each site's calibration points; with exact_groups (two-sample
    data, random partitions only), half of each site's points from each group (treatment_group)."""
    kind = spec["kind"]
    indices = np.arange(len(y))
    if exact_groups:
        if kind not in ("none", "location", "scale"):
            raise ValueError(f"exact group sizes need a random partition (heterogeneity none, location or scale), not {kind}")
        return group_partition(indices, treatment_group(X), sizes, rng)
    if kind in ("none", "location", "scale"):
        return partition(indices, sizes, rng)
    if kind == "dirichlet":
        held_out = min(spec.get("held_out", 0), len(sizes))
        concentrations = ([spec["concentration"]] * (len(sizes) - held_out)
                          + [spec.get("held_out_concentration", 0.01)] * held_out)
        return dirichlet_partition(y, sizes, concentrations, rng)
    if kind == "sort":
        if spec["feature"] >= X.shape[1]:
            raise ValueError(f"heterogeneity.feature {spec['feature']} but the data have {X.shape[1]} features")
        key = X[:, spec["feature"]]
    elif kind == "response":
        key = y
    else:  # cluster
        from sklearn.cluster import KMeans

        key = KMeans(n_clusters=len(sizes), n_init=4, random_state=int(rng.integers(2**31 - 1))).fit_predict(X)
    check_capacity(sizes, len(key))
    # sites fewer than the split: a random subset first, so the blocks span the whole key range
    chosen = np.sort(rng.choice(len(key), sum(sizes), replace=False))
    order = chosen[np.argsort(blended_key(key[chosen], spec["strength"], rng), kind="stable")]
    bounds = np.cumsum([0, *sizes])
    return [order[bounds[j]:bounds[j + 1]] for j in range(len(sizes))]


def blended_key(key: np.ndarray, strength: float, rng: np.random.Generator) -> np.ndarray:
    """strength * (rank of key, scaled to [0, 1]) + (1 - strength) * uniform noise."""
    ranks = np.argsort(np.argsort(key, kind="stable"), kind="stable") / max(len(key) - 1, 1)
    return strength * ranks + (1.0 - strength) * rng.uniform(size=len(key))


def dirichlet_partition(labels: np.ndarray, sizes: list[int], concentration, rng: np.random.Generator):
    """Label skew: site j draws class proportions from Dirichlet(a_j, ..., a_j) (`concentration`:
    one a for every site, or a list of a_j) and fills its n_j places from what remains of each
    class (renormalizing as classes run out)."""
    per_site = list(concentration) if isinstance(concentration, (list, tuple)) else [concentration] * len(sizes)
    labels = np.asarray(labels).astype(int)
    classes = np.unique(labels)
    pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    check_capacity(sizes, len(labels))
    parts = []
    for size, a in zip(sizes, per_site):
        weights = rng.dirichlet(np.full(len(classes), a))
        chosen = []
        for _ in range(size):
            available = np.array([len(pools[c]) > 0 for c in classes], dtype=float)
            p = weights * available
            p = p / p.sum() if p.sum() > 0 else available / available.sum()
            c = classes[rng.choice(len(classes), p=p)]
            chosen.append(pools[c].pop())
        parts.append(np.array(chosen, dtype=int))
    return parts


def site_shifts(spec: dict, m: int, rng: np.random.Generator) -> np.ndarray:
    """alpha_j ~ N(0, sigma^2) for location and scale heterogeneity; zeros otherwise."""
    if spec["kind"] in ("location", "scale"):
        return rng.normal(0.0, spec["sigma"], m)
    return np.zeros(m)


def treatment_shifts(spec: dict, m: int, rng: np.random.Generator) -> np.ndarray:
    """Paper 004 section 4.6: beta_l - delta ~ N(0, sigma_beta^2) per site (location kind only)."""
    if spec["kind"] == "location" and spec.get("sigma_treatment", 0.0) > 0:
        return rng.normal(0.0, spec["sigma_treatment"], m)
    return np.zeros(m)


def treatment_group(X: np.ndarray) -> np.ndarray:
    """The group of each point of two-sample data: the first feature (a 0/1 indicator, standardized
    by the harness) above zero; all False for data without features or with a constant one."""
    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or X.shape[1] == 0:
        return np.zeros(len(X), dtype=bool)
    return X[:, 0] > 0


def shift_response(kind: str, y: np.ndarray, alpha: float) -> np.ndarray:
    if kind == "location":
        return y + alpha
    if kind == "scale":
        return y * np.exp(alpha)
    return y
