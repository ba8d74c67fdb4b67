"""The plugin's own tests: the method with the in-process driver against brute force, its
dropout and lying-site paths, its codec, and one run over site processes with a killed site."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from quorum.protocol.codecs import CODECS, PayloadError
from quorum.plugin import drive, run_session
from quorum.protocol.methods import METHODS, RequestError
from quorum_bisection.codec import Count
from quorum_bisection.method import BisectionCP
from quorum.scenarios.scenario import validate_scenario
from quorum import load_scenario
from quorum.specs.schema import ScenarioError, read_yaml
from quorum.stats.conformal import split_conformal_order

HERE = Path(__file__).resolve().parent.parent


def kth_smallest(site_scores: dict, alpha: float) -> float:
    pooled = np.sort(np.concatenate(list(site_scores.values())))
    return float(pooled[split_conformal_order(pooled.size, alpha) - 1])


def sites(seed: int, m: int = 7) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"site-{j:03d}": rng.exponential(2.0, size=int(rng.integers(5, 60))) for j in range(m)}


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(0)


def test_the_installed_package_registers_its_method_and_codec():
    assert METHODS["bisection_cp"] is BisectionCP
    assert CODECS["count"] is Count


@pytest.mark.parametrize("seed", range(20))
def test_threshold_is_the_pooled_kth_score_to_within_the_bracket_over_two_to_the_rounds(seed):
    scores, alpha, rounds = sites(seed), 0.1, 20
    outcome = run_session(BisectionCP(alpha, lo=0.0, hi=50.0, rounds=rounds), scores, rng_for)
    exact = kth_smallest(scores, alpha)
    assert outcome.status == "ok"
    assert exact <= outcome.threshold <= exact + 50.0 / 2**rounds
    pooled = np.concatenate(list(scores.values()))
    assert np.count_nonzero(pooled <= outcome.threshold) >= split_conformal_order(pooled.size, alpha)


def test_too_few_scores_below_hi_give_the_whole_line():
    scores = {"site-000": np.array([1.0, 2.0, 30.0]), "site-001": np.array([40.0, 50.0])}
    outcome = run_session(BisectionCP(0.2, lo=0.0, hi=10.0, rounds=5), scores, rng_for)
    assert outcome.status == "infinite" and math.isinf(outcome.threshold) and "hi = 10.0" in outcome.reason


def _ask_through(scores: dict, behave):
    halves = {site: BisectionCP.site(values, None, site) for site, values in scores.items()}

    def ask(site, phase, body):
        return behave(site, phase.round, halves[site].answer(phase, body))
    return ask


def test_a_site_that_stops_answering_leaves_the_survivors_threshold():
    scores = sites(7)

    def behave(site, r, count):
        if site == "site-002" and r >= 4:
            raise RequestError("gone")
        return count
    method = BisectionCP(0.1, lo=0.0, hi=50.0, rounds=25)
    outcome = drive(method, {s: len(v) for s, v in scores.items()}, _ask_through(scores, behave), rng_for("c"))
    survivors = {s: v for s, v in scores.items() if s != "site-002"}
    exact = kth_smallest(survivors, 0.1)
    assert outcome.status == "ok" and exact <= outcome.threshold <= exact + 50.0 / 2**25
    assert outcome.details["answered"] == len(scores) - 1 and "site-002" in outcome.details["dropped"]


def test_a_site_whose_counts_contradict_themselves_is_left_out():
    scores = sites(8)

    def behave(site, r, count):
        return count + (3 if site == "site-005" and r == 6 else 0)  # inflates one count
    method = BisectionCP(0.1, lo=0.0, hi=50.0, rounds=25)
    outcome = drive(method, {s: len(v) for s, v in scores.items()}, _ask_through(scores, behave), rng_for("c"))
    assert "contradicts" in outcome.details["dropped"].get("site-005", "") or \
        "above the site's" in outcome.details["dropped"].get("site-005", "")
    survivors = {s: v for s, v in scores.items() if s != "site-005"}
    assert kth_smallest(survivors, 0.1) <= outcome.threshold


@pytest.mark.parametrize("body", [True, -1, 2.0, "3", None])
def test_the_count_codec_refuses_anything_but_a_non_negative_integer(body):
    with pytest.raises(PayloadError):
        Count().decode(body)


def test_the_site_refuses_a_request_without_a_float_threshold():
    with pytest.raises(RequestError):
        BisectionCP.site(np.arange(5.0), None, "site-0").answer("round-0", {"t": "5"})


def test_a_scenario_can_name_the_class_by_import_path_and_a_bad_path_is_named():
    raw = read_yaml(HERE / "scenario.yaml")
    raw["methods"][0] = {"name": "quorum_bisection.method:BisectionCP", "hi": 100.0}
    assert validate_scenario(raw)["methods"][0]["label"] == "bisection_cp"
    raw["methods"][0] = {"name": "quorum_bisection.method:NoSuchClass", "hi": 100.0}
    with pytest.raises(ScenarioError, match=r"methods\[0\]\.name.*no attribute 'NoSuchClass'"):
        validate_scenario(raw)


def test_over_site_processes_a_site_killed_in_round_5_leaves_a_valid_threshold(tmp_path):
    from quorum.runner.study import run_study

    spec = load_scenario(HERE / "scenario.yaml").to_dict()
    summary = run_study(spec, tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    bisection = {int(r["trial"]): r for r in rows if r["method"] == "bisection_cp"}
    central = {int(r["trial"]): r for r in rows if r["method"] == "centralized"}
    assert sorted(bisection) == [0, 1, 2] and all(r["status"] == "ok" for r in bisection.values())
    assert int(bisection[1]["answered"]) == 11 and int(bisection[0]["answered"]) == 12
    for trial in (0, 2):  # nobody dropped: the centralized threshold, from above, within 100 / 2^30
        assert 0 <= float(bisection[trial]["threshold"]) - float(central[trial]["threshold"]) <= 100.0 / 2**30
    assert summary["methods"]["bisection_cp"]["trials"] == 3
    # its own result family, written by Quorum without knowing it (quorum_bisection.result.Bracket)
    assert {r["result"] for r in bisection.values()} == {"bracket"} and central[0]["result"] == "conformal"
    widths = [float(r["width"]) for r in bisection.values()]
    assert all(0 < w <= 100.0 / 2**29 for w in widths)
    assert all(float(r["threshold"]) - float(r["bracket_lo"]) == pytest.approx(float(r["width"])) for r in bisection.values())
    stats = summary["methods"]["bisection_cp"]
    assert stats["result"] == "bracket" and stats["width_mean"] == pytest.approx(sum(widths) / 3)
    assert stats["rounds_mean"] == 31 and "coverage_mean" in stats and "width_mean" in stats["averaged_over"]
