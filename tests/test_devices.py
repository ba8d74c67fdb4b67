"""Where a run computed, said everywhere (issue 51, point 3): summary.json's `devices`, results.csv's
`device` column, the terminal's sites line and trace.json name the device the sites scored on, the
harness trained the model on and the sites trained on, "mixed" with the counts when sites differ.

CUDA is not on this machine (torch's CPU wheel): the mixed cases fake only the device NAME a site
reports (at join, or in its setup answer), never a computation on a device that is not here."""

from __future__ import annotations

import csv
import json

import pytest

from quorum import load_scenario
from runner.devices import DeviceTally, count, describe, devices_words, session_device, training_counts
from runner.study import run_study
from tests.learning_sessions import SCENARIO, SMALL

QUICK = ["trials=1", "sites.count=3", "data.n=300", "data.n_test=200", "model.kind=ridge", "model.params={}",
         "methods=[{name: fedcp_qq}, {name: centralized}]"]


def test_describe_names_one_device_none_or_mixed_with_counts():
    assert describe({}) == "none" and describe({"cpu": 0}) == "none"
    assert describe({"cuda": 4}) == "cuda"
    assert describe({"cuda": 3, "cpu": 7}) == "mixed (cpu 7, cuda 3)"
    assert count({"a": "cpu", "b": "cuda:0", "c": "cpu"}) == {"cpu": 2, "cuda:0": 1}
    assert training_counts({"training_devices": {"cpu": 2, "cuda": 0}}) == {"cpu": 2}
    assert training_counts({"answered": 3}) == {} and training_counts(None) == {}
    assert session_device({"cpu": 3}, "none", {"cuda": 3}) == "scoring=cpu; model_training=none; site_training=cuda"


def test_the_tally_counts_sites_per_device_over_trials_and_sessions():
    tally = DeviceTally()
    tally.trial({"s0": "cpu", "s1": "cuda"}, "cuda")
    tally.trial({"s0": "cpu", "s1": "cuda"}, "cuda")
    tally.session("fedtype", {"cuda": 2})
    tally.session("fedtype", {"cuda": 1, "cpu": 1})  # a later session with one site on the CPU
    tally.session("fedcp_qq", {})  # trains nothing
    summary = tally.summary()
    assert summary["scoring"] == {"device": "mixed (cpu 1, cuda 1)", "sites": {"cpu": 1, "cuda": 1}}
    assert summary["model_training"] == {"device": "cuda", "trials": {"cuda": 2}}
    assert summary["site_training"]["device"] == "mixed (cpu 1, cuda 2)"
    assert summary["site_training"]["methods"] == {"fedtype": "mixed (cpu 1, cuda 2)"}
    assert devices_words(summary) == ("scored on mixed (cpu 1, cuda 1); model trained on cuda; "
                                      "sites trained on mixed (cpu 1, cuda 2)")


def _outputs(out):
    summary = json.loads((out / "summary.json").read_text())
    rows = list(csv.DictReader(open(out / "results.csv")))
    trace = json.loads((out / "trace.json").read_text())
    return summary, rows, trace


def test_an_in_process_run_on_the_cpu_says_cpu_everywhere(tmp_path):
    from runner.report import sites_line

    spec = load_scenario("scenarios/quickstart.yaml", QUICK + ["model.device=cpu"]).to_dict()
    run_study(spec, tmp_path, backend="inprocess")
    summary, rows, trace = _outputs(tmp_path)
    devices = summary["devices"]
    assert devices["scoring"] == {"device": "cpu", "sites": {"cpu": 3}}
    assert devices["model_training"] == {"device": "cpu", "trials": {"cpu": 1}}
    assert devices["site_training"]["device"] == "none"  # conformal methods train nothing at the sites
    assert summary["device"] == "cpu" and summary["site_devices"] == ["cpu"]  # the old keys stay
    assert [r["device"] for r in rows] == ["scoring=cpu; model_training=cpu; site_training=none"] * 2
    assert "; scored on cpu; model trained on cpu" in sites_line(summary)
    assert trace["otherData"]["devices"] == devices
    assert "(scored on cpu; model trained on cpu)" in trace["traceEvents"][0]["args"]["name"]


def test_a_mixed_federation_says_mixed_with_the_counts(tmp_path, monkeypatch):
    """One of three sites says it scored on cuda:0 (only its word is faked): every output says mixed."""
    from runner.report import sites_line
    from sites.trials import TrialCache

    real = TrialCache.site_rows

    def one_on_cuda(self, trial, site_id):
        rows, device = real(self, trial, site_id)
        return rows, ("cuda:0" if site_id == "site-001" else device)

    monkeypatch.setattr(TrialCache, "site_rows", one_on_cuda)
    spec = load_scenario("scenarios/quickstart.yaml", QUICK + ["model.device=cpu"]).to_dict()
    run_study(spec, tmp_path, backend="inprocess")
    summary, rows, trace = _outputs(tmp_path)
    assert summary["devices"]["scoring"] == {"device": "mixed (cpu 2, cuda:0 1)", "sites": {"cpu": 2, "cuda:0": 1}}
    assert summary["site_devices"] == ["cpu", "cuda:0"]
    assert {r["device"] for r in rows} == {"scoring=mixed (cpu 2, cuda:0 1); model_training=cpu; site_training=none"}
    assert "scored on mixed (cpu 2, cuda:0 1)" in sites_line(summary)
    assert "mixed (cpu 2, cuda:0 1)" in trace["traceEvents"][0]["args"]["name"]


@pytest.mark.slow
def test_learning_sites_report_where_they_trained_and_the_harness_trained_nothing(tmp_path, monkeypatch):
    """FedAvg's sites train on the CPU here; one site's setup answer is made to say cuda (its
    word only): site_training is mixed with the counts, model_training none (examples fit nothing)."""
    from protocol.methods.learning_rounds import LearningSite
    from runner.report import sites_line

    real, said = LearningSite._setup, []

    def one_says_cuda(self, body):
        answer = real(self, body)
        if not said:  # the first site to set up
            said.append(True)
            answer["metrics"]["cuda"] = 1
        return answer

    monkeypatch.setattr(LearningSite, "_setup", one_says_cuda)
    spec = load_scenario(SCENARIO, SMALL + ["methods.*.rounds=1", "methods.*.device=cpu"]).to_dict()
    spec["methods"] = [m for m in spec["methods"] if m["name"] == "fedavg"]
    run_study(spec, tmp_path, backend="inprocess")
    summary, rows, trace = _outputs(tmp_path)
    devices = summary["devices"]
    assert devices["model_training"]["device"] == "none" and devices["scoring"]["device"] == "cpu"
    assert devices["site_training"]["device"] == "mixed (cpu 3, cuda 1)"
    assert devices["site_training"]["methods"] == {"fedavg": "mixed (cpu 3, cuda 1)"}
    assert [r["device"] for r in rows] == ["scoring=cpu; model_training=none; site_training=mixed (cpu 3, cuda 1)"]
    assert "; scored on cpu; sites trained on mixed (cpu 3, cuda 1)" in sites_line(summary)
    assert "sites trained on mixed (cpu 3, cuda 1)" in trace["traceEvents"][0]["args"]["name"]


def test_the_crossover_is_where_cuda_stays_faster_at_every_larger_size():
    import importlib.util

    spec = importlib.util.spec_from_file_location("device_crossover", "bench/device_crossover.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = [{"size": s, "parameters": s, "cpu_s": 1.0, "cuda_s": c} for s, c in [(1, 0.5), (2, 2.0), (3, 0.9), (4, 0.1)]]
    assert bench.crossover(rows)["size"] == 3  # faster at 1 too, but not from 1 on
    assert bench.crossover(rows[:2]) is None  # slower at the largest: never overtakes
    assert bench.crossover([{**r, "cuda_s": None} for r in rows]) is None
    (entry,) = bench.crossovers([{**r, "task": "scoring", "family": "mlp", "points": 10, "cuda_s": None} for r in rows],
                                cuda=False)
    assert entry["size"] is None and entry["verdict"].startswith("unmeasured")
