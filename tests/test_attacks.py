"""Issue 35: an adversarial coordinator you can script; issue 50: on both backends.

Every attack runs through the one pump (coordinator.driver) on either backend: in-process in
milliseconds (the in-memory transport, sites and shuffler), and over real site processes (the
private-bins attacks in the default suite, the others in the slower one, `-m slow`).

Each attack of the shipped scenarios runs against live sites under the default policy, and the
run reports what every site refused and why (attacks.csv, summary.json, privacy.csv, events):
no raw value leaves, a switched session is refused, an inflated claim or a batch of one is
withheld by the shuffler, a fabricated table pins few cell limits, and replayed noise predicts
the releases only when the policy says `noise: seeded`.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from runner.study import run_study
from scenarios.scenario import validate_scenario
from quorum import load_scenario
from specs.schema import ScenarioError

ROOT = Path(__file__).resolve().parents[1]
PRIVATE_BINS = ROOT / "scenarios" / "attacks" / "private-bins.yaml"
KANON_TABLE = ROOT / "scenarios" / "attacks" / "kanon-table.yaml"
SECURE_SUM = ROOT / "scenarios" / "attacks" / "secure-sum.yaml"
BUDGET = ROOT / "scenarios" / "attacks" / "budget.yaml"
LYING = ROOT / "scenarios" / "attacks" / "lying-coordinator.yaml"


BACKENDS = ["inprocess", pytest.param("processes", marks=pytest.mark.slow)]


def attacks_of(out: Path) -> dict[str, dict]:
    rows = list(csv.DictReader(open(out / "attacks.csv")))
    summary = json.loads((out / "summary.json").read_text())["attacks"]
    assert [(r["attack"], r["finding"]) for r in rows] == [(r["attack"], r["finding"]) for r in summary]
    return {row["attack"]: row for row in rows}


@pytest.mark.parametrize("backend", ["inprocess", "processes"])
def test_every_attack_on_private_bins_is_refused_or_withheld_and_reported(tmp_path, backend):
    summary = run_study(load_scenario(PRIVATE_BINS, ["trials=1"]).to_dict(), tmp_path, backend=backend)
    rows = attacks_of(tmp_path)
    assert [a["attack"] for a in summary["attacks"]] == ["replay_noise", "forbidden_method", "switch_method",
                                                           "inflate_claim", "batch_of_one", "equivocate", "sybil"]
    forbidden = rows["forbidden_method"]
    assert forbidden["answered"] == "0" and forbidden["refused"] == "10" and "no formal privacy" in forbidden["reasons"]
    assert "0 values released" in forbidden["finding"]
    switched = rows["switch_method"]
    assert switched["refused"] == "10" and "belongs to fedcp2_qq" in switched["reasons"]
    for name, planned in (("inflate_claim", "1000"), ("batch_of_one", "10")):
        assert rows[name]["answered"] == "0"
        assert f"fewer than the {planned} a site's answer was planned (and booked) for" in rows[name]["finding"]
    equivocated = rows["equivocate"]  # site-000 asked for 200 bins, the 9 others for 20: the shuffler sees it,
    # leaves site-000's answer out and withholds the 9 others, fewer than the 10 the session planned for
    assert equivocated["answered"] == "0" and equivocated["refused"] == "10"
    assert equivocated["finding"].startswith("site-000 was asked for 200 bins where every other site was asked for 20; "
                                             "1 message left out of the batch (site-000: it answers another request")
    assert equivocated["finding"].endswith("; the rest withheld")
    sybil = rows["sybil"]  # five senders of the coordinator's making dial the shuffler: none is counted
    assert sybil["answered"] == "10" and sybil["finding"] == (
        "5 forged senders (keys of the coordinator's making) dialled the shuffler; 0 of their sealed messages "
        "were taken into the batch, which held 10 messages")
    results = {r["method"]: r for r in csv.DictReader(open(tmp_path / "results.csv"))}
    assert results["raw_asked"]["status"] == "aborted" and results["inflated"]["status"] == "aborted"
    assert results["equivocated"]["status"] == "aborted"
    assert results["replayed"]["status"] == "ok" and results["switched"]["status"] == "ok"
    privacy = [r for r in csv.DictReader(open(tmp_path / "privacy.csv")) if r["method"] == "raw_asked"]
    assert len(privacy) == 10 and all(r["refused"] == "1" and r["releases"] == "0" for r in privacy)
    events = [json.loads(line) for line in open(tmp_path / "events.jsonl")]
    assert sum(e["event"] == "attack" for e in events) == 7


@pytest.mark.parametrize("backend", BACKENDS)
def test_sybil_senders_pad_a_shuffle_only_where_there_is_no_registry_to_hold_them(tmp_path, backend):
    """The same sybil attack without CURVE (runtime.security: plain, for debugging only): nothing
    checks who dials the shuffler, and the five forged messages are counted as contributors. So
    the registry's allow-list is what holds the line in the test above."""
    spec = load_scenario(PRIVATE_BINS, ["trials=1", "runtime.security=plain"]).to_dict()
    spec["methods"] = [m for m in spec["methods"] if m["label"] == "padded"]
    spec["attacks"] = [a for a in spec["attacks"] if a["method"] == "padded"]
    run_study(validate_scenario(spec), tmp_path, backend=backend)
    sybil = attacks_of(tmp_path)["sybil"]
    assert sybil["answered"] == "15" and "5 of their sealed messages were taken" in sybil["finding"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_asking_again_in_fresh_sessions_or_the_same_one_stops_at_each_sites_default_budget(tmp_path, backend):
    """Issue 47: sites with no policy or budget of their own (epsilon 3 per record, the defaults),
    asked for an epsilon-1 bin and then the same question 10 times more, in fresh sessions (trial
    0) or replayed within the session (trial 1): each site answers exactly 3 times per trial (the
    pld composition of three epsilon-1 pure releases is 3), whatever the coordinator tries."""
    run_study(load_scenario(BUDGET).to_dict(), tmp_path, backend=backend)
    rows = list(csv.DictReader(open(tmp_path / "attacks.csv")))
    assert [(r["trial"], r["attack"]) for r in rows] == [("0", "repeat"), ("1", "replay_request")]
    for row in rows:
        assert (row["asked"], row["answered"], row["refused"]) == ("88", "24", "64")
        assert "privacy budget" in row["reasons"] and "over its budget 3" in row["reasons"]
    totals = [r for r in csv.DictReader(open(tmp_path / "privacy.csv")) if r["method"] == "total"]
    assert len(totals) == 8 and all(float(r["epsilon_composed"]) <= 3.0 + 1e-9 for r in totals)
    assert all(r["releases"] == "6" and r["refused"] == "16" for r in totals)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_secure_sum_where_one_site_is_asked_another_question_aborts_with_the_reason(tmp_path, backend):
    """Issue 47: site-003 is asked for ten times the bins in two secure sums (one-hot bins, DDG
    histograms). In the active mode (the default) each site signs its keys for the question it
    was asked, so site-003's neighbours find its keys not signed for theirs, and site-003 theirs,
    and refuse to share: the session aborts naming it (the semi-honest mode's catch, at mask, by
    the digests inside the share ciphertexts, is tested in the lying-coordinator test below).
    The same sum asked honestly unmasks.
    Issue 48: a claim of 100 times the inputs is refused by every site, under a full graph and a
    sparse one (the claim is more than the sites the session's parameters say it asked)."""
    run_study(load_scenario(SECURE_SUM).to_dict(), tmp_path, backend=backend)
    rows = list(csv.DictReader(open(tmp_path / "attacks.csv")))
    assert [(r["method"], r["attack"]) for r in rows] == [("equivocated_sum", "equivocate"),
                                                        ("equivocated_ddg", "equivocate"),
                                                        ("inflated_full", "inflate_claim"),
                                                        ("inflated_sparse", "inflate_claim")]
    for row in rows[2:]:
        assert (row["answered"], row["refused"]) == ("0", "8")
        assert "claimed for 800 inputs, more than the 8 sites the session asked" in row["finding"]
    for row, bins in zip(rows, (20, 32)):
        refused = int(row["refused"])
        assert 4 <= refused <= 8 and "forged keys: the keys relayed for site-003 were not signed" in row["reasons"]
        assert row["finding"].startswith(f"site-003 was asked for {10 * bins} bins where every other site was asked "
                                         f"for {bins}; {refused} sites refused, the sum was not unmasked: "
                                         f"forged keys: the keys relayed for site-")
    results = {r["method"]: r for r in csv.DictReader(open(tmp_path / "results.csv"))}
    assert results["honest_sum"]["status"] == "ok"
    for label in ("equivocated_sum", "equivocated_ddg"):
        assert results[label]["status"] == "aborted"
        assert results[label]["reason"].startswith("secure aggregation: the coordinator's side was caught lying (keys "
                                                   "relayed in a peer's name that it did not sign)")
    events = [json.loads(line) for line in open(tmp_path / "events.jsonl")]
    assert any(e["event"] == "dropout" and e.get("phase") == "share" and "forged keys" in e["reason"]
               for e in events)


@pytest.mark.parametrize("backend", BACKENDS)
def test_replayed_noise_predicts_every_release_only_under_seeded_noise(tmp_path, backend):
    """With the policy's explicit `noise: seeded` the coordinator's replay predicts all 10 releases
    of each session, and every output says the releases are not private; from the OS CSPRNG the
    finding is recorded (its rate is tested over 300 sessions in test_site_policy)."""
    spec = load_scenario(PRIVATE_BINS, ["trials=2", "sites.policy.noise=seeded"]).to_dict()
    spec["attacks"] = [a for a in spec["attacks"] if a["attack"] == "replay_noise"]
    summary = run_study(validate_scenario(spec), tmp_path, backend=backend)
    assert [a["finding"].split(" (")[0] for a in summary["attacks"]] == \
        ["replayed 10 of 10 releases from the scenario seed"] * 2
    assert summary["privacy"]["noise"] == "seeded"


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fabricated_table_pins_few_limits_and_raw_values_stay_home(tmp_path, backend):
    run_study(load_scenario(KANON_TABLE, ["trials=1"]).to_dict(), tmp_path, backend=backend)
    rows = attacks_of(tmp_path)
    table = rows["fabricated_table"]
    assert table["refused"] == "0" and table["answered"] == "8"
    pinned, total = (int(v) for v in table["finding"].split()[0:3:2])
    assert total >= 40 and pinned <= total // 3  # the paper's rule: pinned == total
    assert rows["forbidden_method"]["answered"] == "0" and rows["forbidden_method"]["refused"] == "8"


def test_attacks_are_validated_against_their_method(tmp_path):
    raw = load_scenario(PRIVATE_BINS).to_dict()
    raw["attacks"] = [{"attack": "fabricated_table", "method": "replayed"},
                      {"attack": "batch_of_one", "method": "nope"},
                      {"attack": "replay_noise", "method": "replayed", "trials": 9},
                      {"attack": "equivocate", "method": "replayed"},
                      {"attack": "substitute_keys", "method": "replayed"},
                      {"attack": "equivocate_survivors", "method": "replayed"}]
    with pytest.raises(ScenarioError) as caught:
        validate_scenario(raw)
    fields = {p.field for p in caught.value.problems}
    assert {"attacks[0].method", "attacks[1].method", "attacks[2].trials", "attacks[3].method",
            "attacks[4].method", "attacks[5].method"} <= fields
    assert sum("codec secagg_ddg" in str(p) for p in caught.value.problems) == 2


def answered_phases(out: Path, label: str) -> set[str]:
    """The phases of session `label` in which some site sent an answer (not a refusal)."""
    return {r["phase"] for r in csv.DictReader(open(out / "ledger.csv"))
            if r["method"] == label and r["direction"] == "up" and r["type"] == "response"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_coordinator_that_substitutes_keys_or_equivocates_survivors_is_caught_only_in_the_active_mode(tmp_path, backend):
    """Issue 48: a coordinator that lies about keys (substitute_keys: site-000 is sent keys of
    its making for every peer) or about who survived (equivocate_survivors: half the sites that
    list site-000 are told it dropped), over real site processes. In the active mode site-000
    refuses the forged keys and the sites refuse to unmask on views that disagree: the sessions
    end naming the lie and no unmasking share leaves any site. In the semi-honest mode, which the
    sites' policy takes here, the forged keys work: the coordinator opens site-000's share
    ciphertexts, rebuilds its mask key (the private half of the key it advertised) and self-mask
    seed, and reads its one-hot input from its masked vector. Equivocating the survivors gets it
    t shares of one of site-000's secrets at most, never of both (a strict-majority threshold),
    and under a full graph the sites' claim check refuses a survivor set smaller than the claim.
    Last, issue 47's equivocate in the semi-honest mode (no signed keys): the digests inside the
    share ciphertexts catch it, and the sites refuse to mask."""
    run_study(load_scenario(LYING).to_dict(), tmp_path, backend=backend)
    rows = {row["method"]: row for row in csv.DictReader(open(tmp_path / "attacks.csv"))}
    results = {r["method"]: r for r in csv.DictReader(open(tmp_path / "results.csv"))}
    assert list(rows) == ["substituted_active", "substituted_semi", "survivors_active", "survivors_semi",
                          "survivors_active_full", "survivors_semi_full", "equivocated_semi"]
    assert results["honest_semi"]["status"] == "ok"  # the semi-honest protocol, asked honestly, unmasks

    forged = rows["substituted_active"]
    assert forged["refused"] == "1" and forged["finding"].startswith(
        "site-000 was sent keys of the coordinator's making for its 6 peers; it refused: share: forged keys: the keys "
        "relayed for site-00")
    assert forged["finding"].endswith("; the session ended, nothing unmasked")
    assert results["substituted_active"]["status"] == "aborted" and results["substituted_active"]["reason"].startswith(
        "secure aggregation: the coordinator's side was caught lying (keys relayed in a peer's name that it did not "
        "sign): 1 site(s) refused, e.g. site-000: forged keys")
    assert answered_phases(tmp_path, "substituted_active") == {"advertise", "share"}

    opened = re.search(r"opened (\d+) of the target's share ciphertexts: with t = (\d+) of them the coordinator "
                       r"rebuilds its self mask and mask key and reads its input", rows["substituted_semi"]["finding"])
    assert opened and int(opened[1]) >= int(opened[2]) == 4
    assert "(rebuilt here: the mask key matches the s key site-000 advertised)" in rows["substituted_semi"]["finding"]
    assert re.search(r"site-000 masked, and its input reads: a one-hot vector, bin \d+ of 20;",
                     rows["substituted_semi"]["finding"])

    disagree = rows["survivors_active"]
    assert disagree["finding"].startswith("site-000 was named dropped to 3 of the 6 sites that list it (")
    assert "sites refused, nothing unmasked: e.g. " in disagree["finding"]
    assert "survivor sets disagree" in disagree["finding"]
    assert results["survivors_active"]["reason"].startswith(
        "secure aggregation: the coordinator's side was caught lying (survivor sets that disagree, or too few signed)")
    assert "unmask" not in answered_phases(tmp_path, "survivors_active")

    counted = re.search(r"the unmask answers carried (\d+) shares of site-000's self-mask seed and (\d+) of its mask "
                        r"key, t = (\d+): not both reached t", rows["survivors_semi"]["finding"])
    assert counted and [int(v) for v in counted.groups()] == [4, 3, 4]
    assert results["survivors_semi"]["status"] == "ok"  # the honest half's self-mask shares suffice: the sum unmasks

    for label in ("survivors_active_full", "survivors_semi_full"):  # 7 survivors named where 8 inputs are claimed
        assert rows[label]["finding"].startswith("site-000 was named dropped to 4 of the 7 sites that list it")
        assert ("only 7 survivors named, fewer than the inputs the sum's noise was claimed for and booked (8)"
                in rows[label]["finding"])
        assert results[label]["status"] == "aborted"
    assert "unmask" not in answered_phases(tmp_path, "survivors_active_full")
    assert ("not both reached t, its input stays hidden (its 8 holders send one share each, 8 in all, fewer than "
            "2t = 10)") in rows["survivors_semi_full"]["finding"]

    # issue 47 in the semi-honest mode: no signed keys, and the digests inside the shares catch it at mask
    mixed = rows["equivocated_semi"]
    assert mixed["finding"].startswith("site-003 was asked for 200 bins where every other site was asked for 20; ")
    assert ("sites refused, the sum was not unmasked: asked different questions: the shares from site-"
            in mixed["finding"])
    assert results["equivocated_semi"]["reason"].startswith(
        "secure aggregation: the coordinator's side was caught lying (different questions in one secure sum)")
    assert "unmask" not in answered_phases(tmp_path, "equivocated_semi")

