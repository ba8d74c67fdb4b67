"""Privacy amplification by shuffling (FMT21) against published figures and against the exact
privacy of shuffled randomized response computed by brute force."""

import math

import numpy as np
import pytest
from scipy import stats

from stats.amplification import closed_form_epsilon, local_epsilon_for, shuffled_delta, shuffled_epsilon


def test_published_figures_of_feldman_mcmillan_talwar():
    # n = 10^5, eps_0 = 4, delta = 1e-6: about 0.17 numerically against about 0.54 closed form
    assert shuffled_epsilon(4.0, 100_000, 1e-6) == pytest.approx(0.17, abs=0.005)
    assert closed_form_epsilon(4.0, 100_000, 1e-6) == pytest.approx(0.54, abs=0.01)


def test_one_party_is_exactly_randomized_response():
    # a single eps_0-RR message: D_{e^eps}(RR(0) || RR(1)) = alpha - e^eps (1 - alpha)
    e0, eps = 1.5, 0.4
    alpha = math.exp(e0) / (1 + math.exp(e0))
    assert shuffled_delta(e0, 1, eps) == pytest.approx(alpha - math.exp(eps) * (1 - alpha), rel=1e-12)
    assert shuffled_delta(e0, 1, e0) == 0.0


def rr_count_pmf(ones: int, zeros: int, alpha: float) -> np.ndarray:
    """pmf of the number of 1s output by eps_0-RR on `ones` 1-bits and `zeros` 0-bits."""
    a = stats.binom.pmf(np.arange(ones + 1), ones, alpha)
    b = stats.binom.pmf(np.arange(zeros + 1), zeros, 1 - alpha)
    return np.convolve(a, b)


@pytest.mark.parametrize("n,e0", [(30, 2.0), (80, 3.0)])
def test_bound_holds_for_shuffled_randomized_response(n, e0):
    """The shuffle of n binary RR messages is their count. Exact delta over every neighbouring
    pair (user 1 holds 0 or 1; j of the others hold 1), both orders, must not exceed the bound."""
    alpha = math.exp(e0) / (1 + math.exp(e0))
    for eps in (0.25, 0.75, 1.5):
        worst = 0.0
        for j in range(n):
            p = rr_count_pmf(j + 1, n - 1 - j, alpha)
            q = rr_count_pmf(j, n - j, alpha)
            worst = max(worst, np.maximum(p - math.exp(eps) * q, 0).sum(), np.maximum(q - math.exp(eps) * p, 0).sum())
        bound = shuffled_delta(e0, n, eps)
        assert worst <= bound + 1e-12
        assert bound < 1.0


def test_amplification_grows_with_parties_and_the_inverse_meets_the_target():
    eps = [shuffled_epsilon(3.0, n, 1e-6) for n in (100, 1_000, 10_000)]
    assert eps[0] > eps[1] > eps[2]
    assert shuffled_epsilon(3.0, 10_000, 1e-6) < closed_form_epsilon(3.0, 10_000, 1e-6)
    for n in (200, 5_000):
        e0 = local_epsilon_for(1.0, n, 1e-6)
        assert e0 > 1.0
        assert shuffled_delta(e0, n, 1.0) <= 1e-6  # the guarantee itself
        assert shuffled_delta(e0 + 1e-3, n, 1.0) > 1e-6  # and the largest such eps_0 (to 1e-3)
    # too few parties to amplify: eps_0 = eps is all one gets
    assert local_epsilon_for(1.0, 5, 1e-6) == pytest.approx(1.0, abs=1e-5)
