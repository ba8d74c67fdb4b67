"""Paper 004's methods as sessions: the summary codec, each method against the pure functions
(or scipy) on the same data, skipped and dropped sites, and whole runs over site processes with
the summaries in the ledger."""

import json
import math

import numpy as np
import pytest
from scipy import stats

from protocol.codecs import CODECS, PayloadError
from protocol.codecs.summary import Summary
from protocol.inprocess import drive, run_session
from protocol.methods import METHODS, RequestError
from runner.outputs import RunDirectory
from runner.study import run_study
from scenarios.scenario import validate_scenario
from quorum import load_scenario
from specs.schema import ScenarioError
from stats.fedquantiles import (lambda_grid, linear_table_quantile, yj_continuous_quantile, yj_likelihood_continuous,
                                yj_likelihood_quantile, yj_site_moments)
from stats.kanon import valid_count
from stats.mannwhitney import (fisher_p_value, p_value, site_statistic, t_sum, t_weighted,
                               z_score)
from transport.ledger import read_ledger
from world.trial import WorldSpec, build_trial

MWU_SCENARIO = "scenarios/paper004/mwu-3-centres.yaml"
QUANTILE_SCENARIO = "scenarios/paper004/quantiles-5-centres.yaml"


def rows_of(x, y):
    return np.column_stack([np.concatenate([x, y]), np.r_[np.zeros(len(x)), np.ones(len(y))]])


def federation(seed=0, sizes=(300, 200, 120), delta=0.2):
    rng = np.random.default_rng(seed)
    groups = [(rng.normal(0, 1, n), rng.normal(delta, 1, n)) for n in sizes]
    return {f"site-{j}": rows_of(x, y) for j, (x, y) in enumerate(groups)}, groups


def rngs(seed=0):
    return lambda name: np.random.default_rng([seed, sum(map(ord, name))])


# -- the summary codec ---------------------------------------------------------------------------


def test_summary_round_trips_scalars_and_vectors_and_refuses_what_the_method_did_not_ask_for():
    codec = Summary({"n": "int", "u": "float", "v": "floats", "c": "ints"}, {"v": 3})
    sent = {"n": 4, "u": -1.5, "v": np.array([1.0, math.inf, 2.0]), "c": np.array([1, 2], dtype=np.int64)}
    body = CODECS["summary"]().encode(sent)  # the site's encoder knows no schema
    back = codec.decode(body)
    assert back["n"] == 4 and back["u"] == -1.5 and back["v"].tolist() == [1.0, math.inf, 2.0]
    assert back["c"].dtype == np.int64 and back["c"].tolist() == [1, 2]
    assert codec.information_bits(back) == 64 * 7
    for bad, words in [({**body, "extra": 1}, "expected fields"), ({k: v for k, v in body.items() if k != "u"}, "expected fields"),
                       ({**body, "n": 1.5}, "'n'"), ({**body, "u": math.nan}, "'u'"),
                       ({**body, "v": body["v"][:16]}, "expected 3 values"),
                       ({**body, "v": np.array([math.nan] * 3).tobytes()}, "NaN"), ({**body, "c": b"1234567"}, "8-byte"),
                       ([1, 2], "map")]:
        with pytest.raises(PayloadError, match=words):
            codec.decode(bad)


# -- Mann-Whitney sessions -----------------------------------------------------------------------


def test_pooled_mwu_session_agrees_with_scipy():
    sites, groups = federation()
    x = np.concatenate([g[0] for g in groups])
    y = np.concatenate([g[1] for g in groups])
    out = run_session(METHODS["pooled_values"](0.05), sites, rngs())
    reference = stats.mannwhitneyu(y, x, alternative="greater", method="asymptotic", use_continuity=False)
    assert out.status == "ok"
    assert out.p_value == pytest.approx(reference.pvalue, rel=1e-9)


@pytest.mark.parametrize("test", ["sum", "weighted", "fisher"])
def test_site_statistics_sessions_equal_the_pure_combinations(test):
    sites, groups = federation(seed=1)
    per_site = [site_statistic(x, y) for x, y in groups]
    expected = {"sum": p_value(t_sum(per_site)), "weighted": p_value(t_weighted(per_site)),
                "fisher": fisher_p_value([p_value(z_score(s)) for s in per_site])}[test]
    out = run_session(METHODS["mwu_sites"](0.05, test=test), sites, rngs())
    assert out.p_value == pytest.approx(expected, rel=1e-12)


def test_impossible_site_statistics_are_left_out_and_named():
    method = METHODS["mwu_sites"](0.05, test="sum")
    sizes = {"a": 20, "b": 20}
    good = site_statistic(np.arange(10.0), np.arange(10.0) + 0.5)
    answers = {"a": {"u": good.u, "variance": good.variance, "n": 10, "m": 10},
               "b": {"u": 1e9, "variance": 1.0, "n": 10, "m": 10}}  # |U| > n m: no data gives this
    out = method.combine(sizes, method.plan(sizes), answers, {}, np.random.default_rng(0))
    assert out.details["impossible"] == ["b"]
    assert out.p_value == pytest.approx(p_value(t_sum([good])))


def test_federated_table_session_counts_every_value_and_tracks_the_pooled_test():
    sites, groups = federation(seed=2, delta=0.15)
    out = run_session(METHODS["mwu_table"](0.05, k=10), sites, rngs())
    assert out.status == "ok" and not out.details["skipped"]
    assert out.details["n_x"] == pytest.approx(sum(len(g[0]) for g in groups))
    assert out.details["n_y"] == pytest.approx(sum(len(g[1]) for g in groups))
    pooled = run_session(METHODS["pooled_values"](0.05), sites, rngs())
    assert abs(out.statistic - pooled.statistic) < 0.3  # the table's ties cost a little
    assert out.details["contributed"] == ["site-0", "site-1", "site-2"]  # largest first


def test_table_session_skips_a_site_that_cannot_bin_first_and_one_that_drops():
    sites, _ = federation(seed=3)
    sites["site-tiny"] = rows_of(np.arange(4.0), np.arange(3.0))  # both groups under K: refuses
    method = METHODS["mwu_table"](0.05, k=10)
    halves = {s: type(method).site(v, rngs()(s), s) for s, v in sites.items()}
    sizes = {s: len(v) for s, v in sites.items()}
    sizes["site-tiny"] = 10_000  # announced as the largest: asked first, refuses, the next site bins first
    released = []

    def ask(site, phase, body):
        if site == "site-1":
            raise RequestError("gone")
        encoder, request = CODECS[method.codec].for_site(body)
        value = halves[site].answer(phase, request)
        released.append(value)
        return encoder.encode(value)

    out = drive(method, sizes, ask, np.random.default_rng(0))
    assert out.status == "ok"
    assert set(out.details["skipped"]) == {"site-tiny", "site-1"}
    assert "K = 10" in out.details["skipped"]["site-tiny"]
    assert out.details["contributed"] == ["site-0", "site-2"]
    for value in released:  # what left the sites: counts 0 or >= K only
        for g in (0, 1):
            assert all(valid_count(c, 10) for c in value[f"cells_{g}"].reshape(-1, 3)[:, 2])


def test_site_refuses_a_malformed_table_request():
    sites, _ = federation()
    half = METHODS["mwu_table"].site(sites["site-0"], np.random.default_rng(0), "site-0")
    for body in [{"k": 1, "extremes": "buffer", "bounds": [], "limits": []},
                 {"k": 10, "extremes": "buffer", "bounds": [], "limits": [0.0, -1.0]},
                 {"k": 10, "extremes": "bounds", "bounds": [], "limits": []},
                 {"k": 10, "extremes": "buffer", "bounds": [], "limits": [], "extra": 1}]:
        with pytest.raises(RequestError):
            half.answer("table-0", body)


# -- quantile sessions ---------------------------------------------------------------------------


def gamma_sites(seed=0, sizes=(492, 368, 276)):
    rng = np.random.default_rng(seed)
    values = [rng.gamma(4.0, 1.0, n) * math.exp(rng.normal(0, 0.05)) for n in sizes]
    return {f"site-{j}": rows_of(v, np.empty(0)) for j, v in enumerate(values)}, values


def test_quantile_loss_converges_to_the_pooled_sample_quantile():
    sites, values = gamma_sites()
    pooled = np.sort(np.concatenate(values))
    levels = [0.02, 0.25, 0.5, 0.75, 0.98, 0.07]
    loss = run_session(METHODS["quantile_loss"](0.1, tolerance=1e-9, levels=levels), sites, rngs())
    reference = run_session(METHODS["pooled_values"](0.1, statistic="quantiles", levels=levels), sites, rngs())
    span = pooled[-1] - pooled[0]
    for p in levels:
        truth = pooled[math.ceil(round(p * pooled.size, 9)) - 1]
        assert reference.estimates[str(p)] == truth
        assert abs(loss.estimates[str(p)] - truth) <= 1e-9 * span
    assert loss.details["rounds"] <= 40


def test_quantile_loss_aborts_with_the_site_named_when_one_drops_mid_way():
    sites, _ = gamma_sites(seed=1)
    method = METHODS["quantile_loss"](0.1)
    halves = {s: type(method).site(v, rngs()(s), s) for s, v in sites.items()}

    def ask(site, phase, body):
        if site == "site-2" and phase == "loss-3":
            raise RequestError("crashed")
        encoder, request = CODECS[method.codec].for_site(body)
        return encoder.encode(halves[site].answer(phase, request))

    out = drive(method, {s: len(v) for s, v in sites.items()}, ask, np.random.default_rng(0))
    assert out.status == "aborted" and "site-2" in out.reason and "loss-3" in out.reason


def test_yj_likelihood_session_equals_the_pure_estimate():
    sites, values = gamma_sites(seed=2)
    grid = lambda_grid(51)
    out = run_session(METHODS["yj_likelihood"](0.1, grid_points=51), sites, rngs())
    moments = [yj_site_moments(v, grid) for v in values]
    for p in (0.02, 0.5, 0.98):
        assert out.estimates[str(p)] == pytest.approx(yj_likelihood_quantile(moments, grid, p), rel=1e-12)


def test_yj_continuous_session_equals_the_pure_fit_and_scipys_mle():
    """fit: continuous, 30 rounds of golden-section search: lambda within the final bracket
    (2 x 0.618^30 ~ 1e-6) of scipy's yeojohnson_normmax on the pooled data and of the bench's
    bounded search (yj_likelihood_continuous); the quantiles equal yj_continuous_quantile's."""
    sites, values = gamma_sites(seed=2)
    out = run_session(METHODS["yj_likelihood"](0.1, fit="continuous", rounds=30), sites, rngs())
    assert out.status == "ok" and out.details["rounds"] == 30 and out.details["lambdas_asked"] == 32
    lam = out.details["yj_lambda"]
    low, high = out.details["bracket"]
    assert high - low == pytest.approx(2.0 * 0.6180339887 ** 30, rel=1e-6)
    assert abs(lam - stats.yeojohnson_normmax(np.concatenate(values))) < 2e-6
    assert abs(lam - yj_likelihood_continuous(lambda v: [yj_site_moments(x, [v]) for x in values])[0]) < 2e-6
    for p in (0.02, 0.25, 0.5, 0.75, 0.98):
        assert out.estimates[str(p)] == pytest.approx(yj_continuous_quantile(values, p), rel=1e-6)
    coarse = run_session(METHODS["yj_likelihood"](0.1, fit="continuous", rounds=3), sites, rngs())
    assert coarse.details["lambdas_asked"] == 5 and abs(coarse.details["yj_lambda"] - lam) <= 2.0 * 0.62 ** 3


def continuous_drive(sites, change=None):
    """A continuous YJ session over `sites`, recording every request; change(site, phase, value)
    may alter an answer (a lying or crashing site)."""
    method = METHODS["yj_likelihood"](0.1, fit="continuous", rounds=5)
    halves = {s: type(method).site(v, rngs()(s), s) for s, v in sites.items()}
    asked = {}

    def ask(site, phase, body):
        encoder, request = CODECS[method.codec].for_site(body)
        asked.setdefault(str(phase), {})[site] = request
        value = halves[site].answer(phase, request)
        return encoder.encode(change(site, str(phase), value) if change else value)

    return drive(method, {s: len(v) for s, v in sites.items()}, ask, np.random.default_rng(0)), asked


def test_yj_continuous_asks_every_site_the_same_lambdas_and_aborts_on_a_lost_or_changed_site():
    sites, _ = gamma_sites(seed=4)
    out, asked = continuous_drive(sites)
    assert out.status == "ok" and list(asked) == ["respond", *[f"search-{t}" for t in range(5)]]
    for phase, bodies in asked.items():  # one question for all, 2 lambdas then 1 a round
        assert set(bodies) == set(sites) and len({json.dumps(b, sort_keys=True) for b in bodies.values()}) == 1
        assert len(next(iter(bodies.values()))["grid"]) == (2 if phase == "respond" else 1)

    def crash(site, phase, value):
        if site == "site-1" and phase == "search-2":
            raise RequestError("crashed")
        return value

    lost, _ = continuous_drive(sites, crash)
    assert lost.status == "aborted" and "site-1" in lost.reason and "search-2" in lost.reason

    def lie(site, phase, value):
        return {**value, "n": value["n"] + 1} if site == "site-0" and phase == "search-1" else value

    lied, _ = continuous_drive(sites, lie)
    assert lied.status == "aborted" and "site-0" in lied.reason and "changed" in lied.reason

    def extra(site, phase, value):
        return ({**value, "sum_h": np.r_[value["sum_h"], 1.0], "sum_h2": np.r_[value["sum_h2"], 1.0]}
                if site == "site-2" and phase == "search-0" else value)

    padded, _ = continuous_drive(sites, extra)
    assert padded.status == "aborted" and "site-2 answered 2 sums for 1 lambdas" in padded.reason


def test_a_site_answers_at_most_max_grid_lambdas_a_session():
    from protocol.methods.fed_quantiles import MAX_GRID

    sites, _ = gamma_sites(seed=5)
    half = METHODS["yj_likelihood"].site(sites["site-0"], rngs()("site-0"), "site-0")
    half.answer("respond", {"grid": lambda_grid(MAX_GRID - 1)})
    half.answer("search-0", {"grid": [1.0]})
    with pytest.raises(RequestError, match="at most 1001"):
        half.answer("search-1", {"grid": [0.5]})


def test_a_site_answers_at_most_max_grid_lambdas_a_session_across_a_close_and_a_reopened_trial(tmp_path):
    """The bound is the site's, not its half's: a lying coordinator that closes the session (or
    reopens the trial), which makes the site build a fresh half, and asks the same session again
    gets no fresh count; a lambda answered before is answered again at no cost (a resumed
    coordinator asks its grid again), and another session has its own count."""
    from protocol.methods.fed_quantiles import MAX_GRID
    from sites.local import SiteLocal

    sites, _ = gamma_sites(seed=5)
    local = SiteLocal("site-0", tmp_path, policy={"non_private": "allow"})
    local.hold(0, 7, sites["site-0"])
    summary = CODECS["summary"]()

    def ask(session, phase, grid):
        return local.answer(session, "yj_likelihood", phase, summary.wrap_request({"grid": [float(v) for v in grid]}))

    grid = np.asarray(lambda_grid(MAX_GRID))
    ask(5, "respond", grid)
    ask(5, "respond", grid)  # the same lambdas again: nothing new leaves
    local.close_session(5)
    with pytest.raises(RequestError, match="at most 1001"):
        ask(5, "respond", grid * 0.999)
    local.hold(0, 7, sites["site-0"])  # the trial reopened: the halves start afresh, the count does not
    with pytest.raises(RequestError, match="at most 1001"):
        ask(5, "search-0", [0.123])
    ask(5, "search-0", [1.0])  # one of the grid's
    ask(6, "respond", grid * 0.999)  # another session


def test_an_honest_continuous_fit_gives_a_small_sites_values_back():
    """What docs/k-anonymous-statistics.md says of `fit: continuous`: not K-anonymous. The moments
    a 6-value site sends at the 32 lambdas of an honest 30-round search, solved by least squares
    for 6 unknowns, are its values to 1e-6."""
    from scipy.optimize import least_squares

    sites, values = gamma_sites(seed=3, sizes=(6, 300, 200))
    method = METHODS["yj_likelihood"](0.1, fit="continuous", rounds=30)
    halves = {s: type(method).site(v, rngs()(s), s) for s, v in sites.items()}
    seen = {}

    def ask(site, phase, body):
        encoder, request = CODECS[method.codec].for_site(body)
        answer = halves[site].answer(phase, request)
        if site == "site-0":
            seen.update({lam: (answer["sum_h"][i], answer["sum_h2"][i], answer["jacobian"])
                         for i, lam in enumerate(request["grid"])})
        return encoder.encode(answer)

    assert drive(method, {s: len(v) for s, v in sites.items()}, ask, np.random.default_rng(0)).status == "ok"
    lams = sorted(seen)
    target = np.r_[[seen[v][0] for v in lams], [seen[v][1] for v in lams], seen[lams[0]][2]]

    def residual(x):
        m = yj_site_moments(x, lams)
        return np.r_[m["sum_h"], m["sum_h2"], m["jacobian"]] - target

    rng = np.random.default_rng(1)
    for _ in range(20):  # a few random starts; the first that fits the moments exactly is the data
        solved = least_squares(residual, rng.uniform(0.5, 10.0, 6))
        if solved.cost < 1e-16:
            break
    assert len(lams) == 32 and np.allclose(np.sort(solved.x), np.sort(values[0]), atol=1e-6)


def test_linear_table_estimate_is_linear_table_quantile_on_the_released_table():
    """estimator: linear reads the one released table (the naive session's own, from the same
    seeds): exactly stats.fedquantiles.linear_table_quantile on its limits and counts."""
    sites, _ = gamma_sites(seed=3)
    tables = {}
    outs = {}
    for estimator in ("linear", "naive"):
        method = METHODS["kanon_quantiles"](0.1, estimator=estimator)
        finish = method.finish

        def spy(table, contributed, skipped, finish=finish, estimator=estimator):
            tables[estimator] = table
            return finish(table, contributed, skipped)

        method.finish = spy
        outs[estimator] = run_session(method, sites, rngs())
    table = tables["linear"]
    assert (table.limits, table.counts) == (tables["naive"].limits, tables["naive"].counts)
    for p in (0.02, 0.25, 0.5, 0.75, 0.98):
        assert outs["linear"].estimates[str(p)] == linear_table_quantile(np.asarray(table.limits),
                                                                          np.asarray(table.counts[0]), p)
    assert outs["linear"].estimates != outs["naive"].estimates


@pytest.mark.parametrize("estimator", ["naive", "linear", "yj_table"])
def test_table_quantiles_land_near_the_pooled_ones(estimator):
    sites, values = gamma_sites(seed=3)
    pooled = np.concatenate(values)
    out = run_session(METHODS["kanon_quantiles"](0.1, estimator=estimator), sites, rngs())
    assert out.status == "ok"
    for p in (0.25, 0.5, 0.75):
        assert abs(out.estimates[str(p)] - np.quantile(pooled, p)) < 0.25 * np.std(pooled)


# -- scenarios and whole runs --------------------------------------------------------------------


def test_scenarios_refuse_methods_on_the_wrong_kind_of_data():
    spec = load_scenario(MWU_SCENARIO).to_dict()
    raw = {k: v for k, v in spec.items()}
    with pytest.raises(ScenarioError, match=r"methods\[0\].name"):
        validate_scenario({**raw, "methods": [{"name": "centralized"}]})
    with pytest.raises(ScenarioError, match=r"methods\[0\].name"):
        validate_scenario({**raw, "model": {"kind": "ridge"}, "methods": [{"name": "mwu_table"}]})
    with pytest.raises(ScenarioError, match=r"data.options.shape"):
        validate_scenario({**raw, "data": {**raw["data"], "options": {"shape": 4}}})


def test_treatment_heterogeneity_shifts_only_the_treatment_group():
    spec = load_scenario(MWU_SCENARIO, ["sites.heterogeneity.sigma=0", "sites.heterogeneity.sigma_treatment=3",
                                        "data.options.delta=0"]).to_dict()
    world = build_trial(WorldSpec.of(spec), 0)
    gaps, controls = [], []
    for rows in world.site_scores.values():
        x, y = rows[rows[:, 1] == 0, 0], rows[rows[:, 1] == 1, 0]
        gaps.append(y.mean() - x.mean())
        controls.append(x.mean())
    assert np.std(gaps) > 1.0  # beta_l ~ N(0, 9) per centre
    assert np.max(np.abs(controls)) < 0.2  # controls unshifted (sigma_alpha = 0)


def test_mwu_run_over_site_processes_reports_p_values_and_meters_each_summary(tmp_path):
    spec = load_scenario(MWU_SCENARIO, ["trials=2"]).to_dict()
    summary = run_study(spec, tmp_path)
    rows = RunDirectory(tmp_path).read_results()
    assert len(rows) == 10 and all(r["status"] == "ok" for r in rows)
    assert all(0 < float(r["p_value"]) < 1 and r["result"] == "test" and "coverage" not in r for r in rows)
    assert summary["methods"]["weighted"]["reject_rate"] is not None
    ledger = read_ledger(tmp_path / "ledger.csv")
    up = {}
    for row in ledger:
        if row["direction"] == "up" and row["method"]:
            up[row["method"]] = up.get(row["method"], 0) + int(row["bytes"])
    assert up["combined"] > 8 * 3000 * 2  # every value, both trials
    assert up["weighted"] < up["federated_table"] < up["combined"]
    phases = {row["phase"] for row in ledger if row["method"] == "federated_table"}
    assert phases == {"table-0", "table-1", "table-2"}
    assert (tmp_path / "pvalues.png").stat().st_size > 10_000


def test_quantile_run_reports_normalized_errors_against_the_mixture_quantile(tmp_path):
    spec = load_scenario(QUANTILE_SCENARIO, ["trials=2", "sites.heterogeneity.kind=none"]).to_dict()
    run_study(spec, tmp_path, backend="inprocess")
    rows = RunDirectory(tmp_path).read_results()
    world = build_trial(WorldSpec.of(spec), 0)
    sd = np.std(world.y_test, ddof=1)
    pooled = next(r for r in rows if r["method"] == "pooled" and r["trial"] == "0")
    estimates, errors = json.loads(pooled["estimates"]), json.loads(pooled["estimate_errors"])
    for level, estimate in estimates.items():  # no shifts: the truth is the test sample's quantile
        truth = np.sort(world.y_test)[math.ceil(float(level) * world.y_test.size) - 1]
        assert errors[level] == pytest.approx((estimate - truth) / sd, abs=1e-9)
    assert (tmp_path / "quantile_errors.png").exists()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["methods"]["yj_likelihood"]["estimate_errors"]) == {"0.02", "0.25", "0.5", "0.75", "0.98"}
