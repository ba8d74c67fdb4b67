"""Issue 47, points 1, 2 and 5: a site that cannot be talked into more.

- Protective by default: with no policy or budget of its own a site spends at most epsilon 3 at
  delta 1e-6 per record, per release and in total, across sessions, restarts and trial numbers.
- Budgets keyed by the people: a release composes with every earlier release that used any of the
  same records, record by record (checked against a brute-force per-record sum), whatever the
  rows' order, their scores (the model), or the trial number a coordinator names.
- A site opens only the trials its policy allows.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from protocol.accounting import DEFAULT_DELTA, DEFAULT_EPSILON, Budget, record_ids
from protocol.codecs import CODECS
from protocol.methods import RequestError
from protocol.policy import SitePolicy
from quorum import load_scenario
from sites.local import SiteLocal
from specs.schema import ScenarioError
from tests.support import TINY
from world.trial import WorldSpec, build_trial

BINS = {"lo": 0.0, "hi": 4.0, "count": 40}


def bin_request(epsilon: float) -> dict:
    return CODECS["exp_mech_bins"]().wrap_request({"level": 0.5, "epsilon": epsilon, "bins": BINS})


def ask(local: SiteLocal, session: int, epsilon: float):
    return local.answer(session, "fedcp2_qq", "respond", bin_request(epsilon))


def test_the_defaults_are_finite_and_the_release_cap_is_no_higher_than_the_total():
    budget, policy = Budget.from_spec(None), SitePolicy.from_spec(None)
    assert budget.epsilon == DEFAULT_EPSILON == 3.0 and budget.delta == DEFAULT_DELTA == 1e-6
    assert budget.per_record
    assert policy.max_epsilon <= budget.epsilon
    assert Budget.from_spec({"epsilon": "unlimited"}).epsilon is None  # only when written


def test_a_default_site_cannot_be_asked_for_its_data_again_and_again(tmp_path):
    """The attack of issue 47: many epsilon-10 comparisons in fresh sessions rebuilt a site's
    minimum, median and maximum. With the defaults an epsilon-10 release is refused outright, and
    epsilon-1 releases stop at the budget, in new sessions, after a restart and under new trial
    numbers over the same records."""
    scores = np.linspace(0.05, 3.95, 60)
    local = SiteLocal("site-0", tmp_path)
    local.hold(0, 1, scores)
    with pytest.raises(RequestError, match="above this site's largest, 3"):
        ask(local, 0, 10.0)
    answered = 0
    for session in range(1, 10):
        try:
            ask(local, session, 1.0)
            answered += 1
        except RequestError as exc:
            assert "privacy budget" in str(exc)
    assert answered == 3  # pld composition of three epsilon-1 pure releases is exactly 3
    restarted = SiteLocal("site-0", tmp_path)
    for trial in (0, 1, 57):
        restarted.hold(trial, 1, scores[::-1])  # a new trial number, the rows reordered
        with pytest.raises(RequestError, match="privacy budget"):
            ask(restarted, trial * 1000 + 1, 0.1)


def brute_force_spent(history: list[tuple[set[int], float]], records: set[int]) -> float:
    """Basic composition, record by record: the largest epsilon any one of `records` has spent."""
    return max((sum(eps for used, eps in history if r in used) for r in records), default=0.0)


def test_a_budget_composes_record_by_record_as_brute_force_does(tmp_path):
    """Releases over overlapping record sets, with ids reordered and the rows rescored between them:
    the site admits a release exactly when no record would pass the budget (basic composition,
    compared with a brute-force per-record sum over every step)."""
    budget = {"epsilon": 3.0, "composition": "basic"}
    local = SiteLocal("site-0", tmp_path, budget=budget)
    rng = np.random.default_rng(3)
    plan = [(range(0, 10), 2.0), (range(10, 20), 2.0), (range(5, 15), 1.0), (range(0, 20), 0.5),
            (range(20, 30), 3.0), (range(15, 25), 0.5), (range(25, 30), 0.1), (range(0, 5), 1.0)]
    history: list[tuple[set[int], float]] = []
    ids = np.arange(1, 31, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)  # any 64-bit identities
    for session, (chosen, epsilon) in enumerate(plan):
        records = set(chosen)
        order = rng.permutation(sorted(records))
        scores = rng.uniform(0.1, 3.9, size=len(order))  # another model's scores of the same people
        trial = session % 3  # the trial number a coordinator names changes nothing
        local.hold(trial, 0, scores, records=ids[order])
        allowed = brute_force_spent(history, records) + epsilon <= 3.0 + 1e-9
        if allowed:
            ask(local, trial * 1000 + session, epsilon)
            history.append((records, epsilon))
        else:
            with pytest.raises(RequestError, match="privacy budget"):
                ask(local, trial * 1000 + session, epsilon)
    # the plan exercises both answers, and a union of the overlapping sets' spending (5 at step 2)
    # would have refused what the per-record rule rightly admits
    assert [eps for _, eps in history] == [2.0, 2.0, 1.0, 3.0, 1.0]


def test_a_dataset_budget_counts_every_release_whatever_the_records(tmp_path):
    local = SiteLocal("site-0", tmp_path, budget={"epsilon": 2.0, "composition": "basic", "scope": "dataset"})
    local.hold(0, 0, np.linspace(0, 1, 10), records=np.arange(10, dtype=np.uint64))
    ask(local, 0, 1.5)
    local.hold(1, 0, np.linspace(0, 1, 10), records=np.arange(100, 110, dtype=np.uint64))
    with pytest.raises(RequestError, match="per dataset"):
        ask(local, 1000, 1.0)


def test_record_ids_follow_the_raw_row_not_its_order_or_transform():
    X = np.random.default_rng(0).normal(size=(50, 3))
    y = X.sum(axis=1)
    ids = record_ids(X, y)
    assert len(set(ids.tolist())) == 50
    order = np.random.default_rng(1).permutation(50)
    assert np.array_equal(record_ids(X[order], y[order]), ids[order])
    assert not np.intersect1d(record_ids(X + 1e-9, y), ids).size  # another row is another record


def world(spec: dict, trial: int):
    return build_trial(WorldSpec.of(spec), trial)


def test_a_real_data_set_keeps_its_records_across_trials_and_models():
    """Each trial re-splits the same file: the same people recur (under other standardisations,
    another model), so their identities recur; a synthetic source draws new people each trial."""
    real = {"data": {"source": "sklearn", "name": "diabetes"}, "sites.count": 3, "sites.budget": {"epsilon": "unlimited"}}
    base = load_scenario(TINY, real).to_dict()
    ridge0, ridge1 = world(base, 0), world(base, 1)
    forest = load_scenario(TINY, {**real, "model": {"kind": "cqr_forest", "params": {"n_estimators": 5}}}).to_dict()
    forest0 = world(forest, 0)
    for site in ridge0.shards:
        assert np.array_equal(ridge0.record_ids[site], forest0.record_ids[site])  # rescoring changes nothing
        assert not np.array_equal(ridge0.site_scores[site], forest0.site_scores[site])
    ids0 = np.concatenate(list(ridge0.record_ids.values()))
    ids1 = np.concatenate(list(ridge1.record_ids.values()))
    assert np.intersect1d(ids0, ids1).size > 0.2 * len(ids0)  # re-split: many of the same people
    synthetic = load_scenario(TINY).to_dict()
    fresh0, fresh1 = world(synthetic, 0), world(synthetic, 1)
    assert not np.intersect1d(np.concatenate(list(fresh0.record_ids.values())),
                              np.concatenate(list(fresh1.record_ids.values()))).size


def test_a_site_opens_only_the_trials_its_policy_allows(tmp_path):
    from sites.trials import TrialCache

    local = SiteLocal("site-000", tmp_path, policy={"trials": 5}, trials=TrialCache(tmp_path, ["site-000"]))
    with pytest.raises(RequestError, match="opens trials 0-4 only, not 7"):
        local.open_trial(7, 0)


def test_a_scenario_past_its_sites_budget_or_trials_fails_validation_naming_the_fields():
    with pytest.raises(ScenarioError) as caught:
        load_scenario(TINY, {"sites.budget": {}, "sites.policy": {"non_private": "allow"}, "trials": 101})
    text = str(caught.value)
    assert "sites.budget.epsilon" in text and "compose to epsilon 7" in text
    assert "epsilon 5 for one release is above this site's largest, 3" in text
    assert "field 'trials'" in text and "100 trials the sites' policy opens" in text
    for combination in itertools.product([{"epsilon": "unlimited"}], [{"non_private": "allow", "max_epsilon": 5}]):
        load_scenario(TINY, {"sites.budget": combination[0], "sites.policy": combination[1]})


def test_a_site_run_by_hand_serves_its_operator_s_policy_or_the_defaults_never_the_study_s(tmp_path):
    """`run.py site --scenario STUDY` without --policy: the protective defaults, whatever the study's
    sites.policy says (here: raw releases allowed, epsilon 5, budget 8); the study's only when the
    operator accepts it, and then the terminal says what was accepted."""
    from click.testing import CliRunner

    from quorum.cli import cli
    from quorum.hosting import describe_site_policy, site_policy
    from scenarios.scenario import default_site_policy

    study = load_scenario(TINY)
    policy, budget, source = site_policy(None, study)
    assert (policy, budget) == default_site_policy() and "protective defaults" in source
    policy, budget, source = site_policy(None, study, accept_study_policy=True)
    assert policy["non_private"] == "allow" and budget["epsilon"] == 8 and "accepted by the operator" in source
    assert "budget: epsilon 8 at delta 1e-06 per record" in describe_site_policy(policy, budget)[1]
    own = tmp_path / "policy.yaml"
    own.write_text("max_epsilon: 1\nbudget: {epsilon: 2}\n")
    policy, budget, source = site_policy(own, study)
    assert policy["max_epsilon"] == 1 and budget["epsilon"] == 2 and str(own) in source
    with pytest.raises(ValueError, match="not both"):
        site_policy(own, study, accept_study_policy=True)
    with pytest.raises(ValueError, match="needs the study's --scenario"):
        site_policy(None, None, accept_study_policy=True)
    refused = CliRunner().invoke(cli, ["site", "--connect", "tcp://127.0.0.1:1", "--site-id", "site-000", "--plain",
                                       "--workdir", str(tmp_path / "w"), "--accept-study-policy"])
    assert refused.exit_code == 2 and "needs the study's --scenario" in refused.output


def test_privacy_csv_reports_the_worst_record_across_trials(tmp_path):
    """A record in two trials' sets spent both releases; privacy.csv's total is that record's."""
    from runner.privacy import privacy_rows, read_accounts
    from sites.storage import read_account

    budget = {"epsilon": 3.0, "composition": "basic"}
    local = SiteLocal("site-000", tmp_path, budget=budget)
    local.hold(0, 0, np.linspace(0, 1, 10), records=np.arange(0, 10, dtype=np.uint64))
    ask(local, 1, 1.0)
    local.hold(1, 0, np.linspace(0, 1, 10), records=np.arange(5, 15, dtype=np.uint64))
    ask(local, 1001, 1.5)
    local.hold(2, 0, np.linspace(0, 1, 10), records=np.arange(100, 110, dtype=np.uint64))
    ask(local, 2001, 2.5)
    assert len(read_account(tmp_path, "site-000")) == 3 + 3  # three sets, three releases
    rows = privacy_rows(read_accounts(tmp_path, ["site-000"], Budget.from_spec(budget)), {})
    total = next(r for r in rows if r["method"] == "total")
    assert total["epsilon_basic"] == pytest.approx(2.5)  # 1 + 1.5 for records 5-9 is 2.5, as is trial 2
    local.hold(3, 0, np.linspace(0, 1, 3), records=np.array([7, 8, 100], dtype=np.uint64))
    ask(local, 3001, 0.5)
    rows = privacy_rows(read_accounts(tmp_path, ["site-000"], Budget.from_spec(budget)), {})
    assert next(r for r in rows if r["method"] == "total")["epsilon_basic"] == pytest.approx(3.0)


STUDY = """name: {name}
seed: {seed}
trials: 1
alpha: 0.1
data: {{source: sklearn, name: diabetes}}
split: {{train: 0.3, calibration: 0.6, test: 0.1}}
sites: {{count: 2, sizes: equal, budget: {{epsilon: unlimited}}, policy: {{max_epsilon: 5}}}}
model: {{kind: ridge}}
methods:
  - {{name: fedcp2_qq, epsilon: 2.0, bins: {{count: 10, lo: training, hi: training}}}}
runtime:
  deadlines: {{hello: 60, join: 30, respond: 20}}
"""


def run_by_hand(tmp_path, name: str, seed: int, sitehost) -> tuple[dict, str]:
    """A study of one coordinator (`run.py coordinator`) and two sites (`run.py site`, the
    protective defaults: no --policy), each its own process; results.csv's row and the sites' output."""
    import csv
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    study = tmp_path / f"{name}.yaml"
    study.write_text(STUDY.format(name=name, seed=seed))
    coordinator = subprocess.Popen(
        [sys.executable, str(root / "run.py"), "coordinator", "--scenario", str(study), "--bind", "tcp://127.0.0.1:*",
         "--plain", "--out", str(tmp_path / name), "--hello-timeout", "60"],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        while len(seen) < 10 and not (seen and seen[-1].startswith("listening at ")):
            seen.append(coordinator.stdout.readline())
        endpoint = seen[-1].split()[2]
        sites = subprocess.run(
            [sys.executable, str(root / "run.py"), "site", "--connect", endpoint, "--site-ids", "0-1", "--scenario",
             str(study), "--plain", "--workdir", str(sitehost), "--idle-timeout", "60"],
            cwd=root, capture_output=True, text=True, timeout=240)
        output, _ = coordinator.communicate(timeout=240)
    finally:
        coordinator.kill()
    assert coordinator.returncode == 0, output + sites.stdout + sites.stderr
    return next(csv.DictReader(open(tmp_path / name / "results.csv"))), sites.stdout


def test_a_new_study_over_the_same_people_draws_on_the_same_budget_over_real_processes(tmp_path):
    """Budget reset by a new run directory, a new seed (another split: the same people reordered,
    restandardised, rescored by another model fit) and trial number 0 again: sites run by hand
    with the defaults (whatever the study's `budget: unlimited` says) answer the first study's
    epsilon-2 release and refuse the second's, since the records they share would pass epsilon 3.
    (Both studies' own validation passes: each asks 2, within the defaults' 3 per release.)"""
    sitehost = tmp_path / "sitehost"  # the operator's own storage, kept between studies
    first, printed = run_by_hand(tmp_path, "first", 7, sitehost)
    assert first["status"] == "ok" and first["answered"] == "2", first["reason"]
    assert "site policy enforced (the protective defaults (no --policy given))" in printed
    assert "budget: epsilon 3 at delta 1e-06 per record" in printed
    second, _ = run_by_hand(tmp_path, "second", 11, sitehost)
    assert second["status"] == "aborted" and "privacy budget" in second["reason"], second


def test_a_central_claim_on_an_unshuffled_bin_is_refused(tmp_path):
    """Red team, issue 47: a claim of central epsilon 3 over 100,000 shuffled messages, attached to
    a plain fedcp2_qq (or private_cp_local) request, made a default site release an epsilon-7.85
    bin straight to the coordinator and book 3. A claim is honoured only where the method's own
    codec shuffles or sums the answer."""
    from protocol.methods import METHODS
    from stats.amplification import local_epsilon_for

    eps0 = local_epsilon_for(3.0, 100_000, 1e-6)
    assert eps0 > 7
    claimed = {"level": 0.5, "epsilon": eps0, "bins": BINS, "central": {"epsilon": 3.0, "delta": 1e-6,
                                                                         "messages": 100_000}}
    for name in ("fedcp2_qq", "private_cp_local"):
        with pytest.raises(RequestError, match="central claim on a bin that goes to the coordinator unshuffled"):
            METHODS[name].spend("respond", claimed)
    assert METHODS["fedcp2_qq_shuffle"].spend("respond", claimed).epsilon == 3.0  # shuffled: backed, booked
    local = SiteLocal("site-0", tmp_path)
    local.hold(0, 0, np.linspace(0.05, 3.95, 60))
    with pytest.raises(RequestError, match="unshuffled"):
        local.answer(1, "fedcp2_qq", "respond", CODECS["exp_mech_bins"]().wrap_request(claimed))
    assert [r["kind"] for r in local.account.records] == ["refused"]


def test_a_csv_record_is_the_whole_row_whatever_features_or_column_order_a_study_picks(tmp_path):
    """Red team, issue 47: identities hashed from the study's feature columns changed with the
    features a study listed, giving the same people a fresh budget in every study version."""
    from data.real import load_csv

    rng = np.random.default_rng(2)
    table = {"age": rng.integers(20, 80, 40), "bmi": rng.normal(25, 4, 40).round(1),
             "dose": rng.uniform(0, 1, 40).round(3), "t": rng.normal(size=40).round(4)}
    header = list(table)
    straight, shuffled = tmp_path / "a.csv", tmp_path / "b.csv"
    straight.write_text(",".join(header) + "\n" + "\n".join(",".join(str(table[c][i]) for c in header)
                                                           for i in range(40)) + "\n")
    order = ["t", "dose", "age", "bmi"]
    shuffled.write_text(",".join(order) + "\n" + "\n".join(",".join(str(table[c][i]) for c in order)
                                                         for i in range(40)) + "\n")
    ids = load_csv(straight, "t", ["age", "bmi", "dose"], with_ids=True)[2]
    assert len(set(ids.tolist())) == 40
    for path, target, features in ((straight, "t", ["dose", "age"]), (shuffled, "t", ["bmi"]),
                                   (shuffled, "dose", ["age", "t"]), (straight, "t", [])):
        assert np.array_equal(load_csv(path, target, features, with_ids=True)[2], ids)


def test_a_person_moved_to_another_site_id_of_the_same_host_keeps_one_budget(tmp_path):
    """Red team, issue 47: a study re-splitting one file over a host's site ids moved a person
    from site-000 to site-001 between trials, and each site id's own account let them spend 3
    again. The sites one process serves share one record ledger (sites.trials.TrialCache)."""
    from sites.trials import TrialCache

    cache = TrialCache(tmp_path, ["site-000", "site-001"])
    first, second = (SiteLocal(site, tmp_path, budget={"epsilon": 3.0, "composition": "basic"}, trials=cache)
                     for site in ("site-000", "site-001"))
    first.hold(0, 0, np.linspace(0, 1, 4), records=np.array([1, 2, 3, 4], dtype=np.uint64))
    ask(first, 1, 2.0)
    second.hold(1, 0, np.linspace(0, 1, 4), records=np.array([4, 5, 6, 7], dtype=np.uint64))  # person 4 moved
    with pytest.raises(RequestError, match="spent so far: 2"):
        ask(second, 1001, 1.5)
    ask(second, 1002, 1.0)  # 2 + 1 = 3 for person 4: fits
    restarted = SiteLocal("site-001", tmp_path, budget={"epsilon": 3.0, "composition": "basic"},
                          trials=TrialCache(tmp_path, ["site-001"]))  # alone in a new process: its own sets
    restarted.hold(2, 0, np.linspace(0, 1, 2), records=np.array([5, 6], dtype=np.uint64))
    with pytest.raises(RequestError, match="privacy budget"):
        ask(restarted, 2001, 2.5)


def test_the_real_and_csv_sources_name_the_same_people_by_the_same_identities():
    """Red team round 2, issue 47: a study naming one file as `real` (name: concrete) and then as
    `csv` (its path) got a fresh budget for the same people, each source hashing rows its own way.
    Both now identify a row by the file row it came from, read as text."""
    from data.real import default_directory, load_csv, load_real, missing_files

    directory = default_directory()
    if missing_files("concrete", directory):
        pytest.skip(f"no Concrete_Data.csv in {directory}")
    path = directory / "Concrete_Data.csv"
    real = load_real("concrete", with_ids=True)[2]
    from data.real import csv_columns

    header = csv_columns(path)
    for target, features in ((header[-1], []), (header[0], header[3:5])):
        assert np.array_equal(load_csv(path, target, features, with_ids=True)[2], real)
