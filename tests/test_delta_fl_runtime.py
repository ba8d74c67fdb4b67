"""DP-Δ-FL over real site processes (issue 49): distributed discrete Gaussian noise under SecAgg+,
two sites killed in the middle of a round's update sum, and sites whose budget runs out refusing
the rounds they cannot pay for."""

import csv
import json

import pytest

import quorum

SCENARIO = "scenarios/paper001/fig3-faults.yaml"
KILLED = {"site-003", "site-011"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig3-faults") / "run"
    quorum.run(quorum.load_scenario(SCENARIO), out, backend="processes")
    rows = list(csv.DictReader(open(out / "results.csv")))
    rounds = list(csv.DictReader(open(out / "rounds.csv")))
    privacy = list(csv.DictReader(open(out / "privacy.csv")))
    events = [json.loads(line) for line in open(out / "events.jsonl")]
    return rows, rounds, privacy, events


def test_the_training_survives_sites_killed_mid_round(run):
    rows, rounds, _, events = run
    assert [r["status"] for r in rows] == ["ok"], rows[0]["reason"]
    crashed = {e["site"] for e in events if e["event"] == "dropout" and e.get("phase") == "update-mask-3"}
    assert crashed and crashed <= KILLED, crashed
    fourth = rounds[3]
    # planned for 2 dropouts a round: the round's sum holds the noise it was planned for and is unmasked
    assert fourth["skipped"] == "" and int(fourth["answered"]) == int(fourth["sampled"]) - len(crashed)
    # the killed sites are not sampled again: the pool shrinks by them
    assert int(rounds[4]["pool"]) == int(fourth["pool"]) - len(crashed)
    later = [e for e in events if e.get("site") in crashed and e.get("phase", "").rpartition("-")[2].isdigit()
             and int(e["phase"].rpartition("-")[2]) > 3]
    assert later == [], later[:2]
    details = json.loads(rows[0]["details"])
    assert details["noise"] == "distributed" and details["epsilon_central"] > 0 and details["p90_error"] <= 1


def test_a_site_refuses_the_rounds_its_budget_cannot_pay_for(run):
    rows, rounds, privacy, events = run
    refusals = [e for e in events if e["event"] == "dropout" and "privacy budget" in e.get("reason", "")]
    assert refusals, "no site ran out of budget"
    assert all("over its budget 16" in e["reason"] and "unamplified" in e["reason"] for e in refusals)
    totals = [r for r in privacy if r["method"] == "total"]
    assert any(int(r["refused"]) > 0 for r in totals)
    assert max(float(r["epsilon_composed"]) for r in totals) <= 16.0 + 1e-9
    # a round whose sites refused below the planned noise asks nothing more and says so
    short = [r for r in rounds if r["skipped"]]
    assert short and all("noise shortfall" in r["skipped"] for r in short)
