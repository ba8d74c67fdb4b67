"""run.py: plan, validate and run as a user calls them."""

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from stats.orderstats import qq_coverage

ROOT = Path(__file__).resolve().parent.parent


def cli(*args, check=True):
    result = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    if check and result.returncode != 0:
        raise AssertionError(result.stdout + result.stderr)
    return result


def test_plan_json():
    out = json.loads(cli("plan", "--alpha", "0.1", "--sites", "5", "--n", "10", "--json").stdout)
    assert (out["ell"], out["k"]) == (10, 3)
    assert out["coverage"] == pytest.approx(0.9256259545517654, abs=1e-12)


def test_plan_table_is_indexed_ell_then_k():
    out = json.loads(cli("plan", "--alpha", "0.1", "--sites", "4", "--n", "6", "--json", "--table").stdout)
    assert len(out["M"]) == 6 and len(out["M"][0]) == 4
    assert out["M"][4][2] == pytest.approx(qq_coverage(4, 6, 5, 3), abs=1e-15)
    assert out["M"][out["ell"] - 1][out["k"] - 1] == out["coverage"]


def test_plan_text_and_infinite_case():
    assert "ell*=18 k*=35" in cli("plan", "--alpha", "0.1", "--sites", "50", "--n", "20").stdout
    out = json.loads(cli("plan", "--alpha", "0.1", "--sites", "1", "--n", "5", "--json").stdout)
    assert out["ell"] is None and "whole line" in out["reason"]


def test_validate_reports_errors_with_exit_code_2(tmp_path):
    assert "OK" in cli("validate", "scenarios/quickstart.yaml").stdout
    result = cli("validate", "scenarios/quickstart.yaml", "--set", "alpha=2", check=False)
    assert result.returncode == 2
    assert "scenarios/quickstart.yaml: field 'alpha': expected a number > 0 and < 1, got 2" in result.stderr


def test_run_writes_the_outputs(tmp_path):
    out = tmp_path / "run"
    result = cli("run", "tests/scenarios/tiny.yaml", "--out", str(out), "--trials", "1")
    assert "fedcp_qq" in result.stdout
    assert {p.name for p in out.iterdir()} >= {"scenario.yaml", "results.csv", "events.jsonl", "summary.json", "logs"}
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [r["method"] for r in rows] == ["fedcp_qq", "fedcp_avg", "centralized", "fedcp2_qq", "private_cp",
                                           "private_cp_local"]
    assert {"trial", "method", "coverage", "size"} <= set(rows[0])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trials"] == 1 and set(summary["methods"]) == {r["method"] for r in rows}
    assert cli("run", "tests/scenarios/tiny.yaml", "--out", str(out), check=False).returncode != 0  # no overwrite


PAPER004 = "307,250,208,172,143,118,98,81,67,56"


def test_plan_unequal_sizes_paper_rule_and_optimized():
    paper = json.loads(cli("plan", "--alpha", "0.1", "--sizes", PAPER004, "--json").stdout)
    assert paper["rule"] == "paper_rule" and paper["ell"][0] == 278 and len(paper["ell"]) == 10
    best = json.loads(cli("plan", "--alpha", "0.1", "--sizes", PAPER004, "--optimize", "--json").stdout)
    assert isinstance(best["ell"], list) and len(best["ell"]) == 10 and best["k"] >= 1
    assert best["coverage_paper_rule"] == pytest.approx(paper["coverage"], abs=1e-15)
    assert 0.9 <= best["coverage"] < best["coverage_paper_rule"]


def test_plan_with_dropouts_and_bad_arguments():
    robust = json.loads(cli("plan", "--alpha", "0.1", "--sizes", PAPER004, "--optimize",
                            "--dropouts", "3", "--json").stdout)
    assert robust["dropouts"] == 3 and robust["coverage"] >= 0.9
    assert cli("plan", "--alpha", "0.1", "--sizes", "10,x", check=False).returncode == 2
    assert cli("plan", "--alpha", "0.1", "--sizes", "10,12", "--sites", "2", "--n", "3", check=False).returncode == 2
    assert cli("plan", "--alpha", "0.1", "--sizes", "10,12", "--dropouts", "2", check=False).returncode == 2


def test_sweep_writes_one_table_and_plots(tmp_path):
    out = tmp_path / "sweep"
    result = cli("sweep", "tests/scenarios/tiny.yaml", "--grid", "sites.count=2,4", "--trials", "1",
                 "--set", "methods=[{name: fedcp_qq}, {name: centralized}]", "--out", str(out))
    assert "4 rows" in result.stdout
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert [(r["sites.count"], r["method"]) for r in rows] == [("2", "fedcp_qq"), ("2", "centralized"),
                                                                ("4", "fedcp_qq"), ("4", "centralized")]
    assert all(float(r["bytes_up_per_site"]) > 0 for r in rows)
    assert {p.name for p in out.glob("*.png")} == {"cost_vs_sites_count.png", "utility_vs_cost.png",
                                                   "coverage_size.png"}
    assert (out / "sites.count=2" / "ledger.csv").exists()
    assert [r["run"] for r in rows] == [str(out / "sites.count=2")] * 2 + [str(out / "sites.count=4")] * 2
    assert "Sweep: coverage and size" in result.stdout and "│ 4 " in result.stdout  # the comparison, printed
    bad = cli("sweep", "tests/scenarios/tiny.yaml", "--grid", "sites.count=2,zero", "--out", str(tmp_path / "x"),
              check=False)
    assert bad.returncode == 2 and "sites.count" in bad.stderr


def test_a_sweep_over_models_and_a_pooled_plot(tmp_path):
    out = tmp_path / "models"
    cli("sweep", "tests/scenarios/tiny.yaml", "--grid",
        "model=[{kind: ridge}, {kind: cqr_forest, params: {n_estimators: 20}}]", "--trials", "2",
        "--set", "methods=[{name: fedcp_qq}, {name: centralized}]", "--backend", "inprocess", "--out", str(out))
    rows = list(csv.DictReader(open(out / "sweep.csv")))
    assert [(r["model"], r["method"], r["trials"]) for r in rows] == [
        ("ridge", "fedcp_qq", "2"), ("ridge", "centralized", "2"),
        ("cqr_forest", "fedcp_qq", "2"), ("cqr_forest", "centralized", "2")]
    assert (out / "model=cqr_forest" / "results.csv").exists() and (out / "coverage_size.png").stat().st_size > 0
    pooled = cli("plot", str(out / "model=ridge"), str(out / "model=cqr_forest"), "--out", str(tmp_path / "f.png"))
    assert "8 rows from 2 run(s)" in pooled.stdout and (tmp_path / "f.png").stat().st_size > 0
    bad = cli("plot", str(tmp_path), "--out", str(tmp_path / "g.png"), check=False)
    assert bad.returncode != 0 and "not a run directory" in bad.stderr


def test_a_coordinator_bound_to_any_port_prints_the_port_and_sites_reach_it(tmp_path):
    """Keys split as between parties (issue 35): the coordinator's host makes its own pair, the
    site host makes its sites' pairs and sends only the public halves; the site operator's own
    policy file decides what its sites serve."""
    tiny = str(ROOT / "tests" / "scenarios" / "tiny.yaml")
    ckeys, skeys = tmp_path / "coordinator-keys", tmp_path / "site-keys"
    cli("keys", "--dir", str(ckeys), "--coordinator")
    cli("keys", "--dir", str(skeys), "--site-ids", "0-3", "--coordinator-key", str(ckeys / "coordinator.key"))
    for public in skeys.glob("site-*.key"):
        (ckeys / public.name).write_bytes(public.read_bytes())
    assert not list(ckeys.glob("site-*.key_secret")) and len(list(skeys.glob("site-*.key_secret"))) == 4
    policy = tmp_path / "policy.yaml"
    policy.write_text("non_private: allow\nmethods: [fedcp_qq, fedcp_avg, centralized, fedcp2_qq, private_cp]\n")
    coordinator = subprocess.Popen(
        [sys.executable, str(ROOT / "run.py"), "coordinator", "--scenario", tiny, "--bind", "tcp://127.0.0.1:*",
         "--keys", str(ckeys), "--out", str(tmp_path / "run"), "--trials", "1", "--hello-timeout", "60"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        seen = []
        while len(seen) < 10 and not (seen and seen[-1].startswith("listening at ")):
            seen.append(coordinator.stdout.readline())  # the run's header comes first
        line = seen[-1]
        assert line.startswith("listening at tcp://127.0.0.1:"), seen
        endpoint = line.split()[2]
        assert not endpoint.endswith(":*") and int(endpoint.rsplit(":", 1)[1]) > 0
        sites = cli("site", "--connect", endpoint, "--site-ids", "0-3", "--scenario", tiny, "--keys",
                    str(skeys), "--workdir", str(tmp_path / "sitehost"), "--idle-timeout", "60",
                    "--policy", str(policy))
        output, _ = coordinator.communicate(timeout=240)
    finally:
        coordinator.kill()
    assert coordinator.returncode == 0, output + sites.stdout
    rows = {r["method"]: r for r in csv.DictReader(open(tmp_path / "run" / "results.csv"))}
    assert len(rows) == 6 and all(r["sites"] == "4" for r in rows.values())
    # private_cp_local is not in the operator's list: every site refused it, whatever the scenario said
    assert rows["private_cp_local"]["status"] == "aborted" and "answers only" in rows["private_cp_local"]["reason"]
    assert rows["centralized"]["status"] == "ok"
    assert f"site policy enforced (the operator's file {policy})" in sites.stdout
    assert "raw releases: allow" in sites.stdout and "budget: epsilon 3 at delta 1e-06 per record" in sites.stdout
