"""One run of a scenario: trials, sessions, evaluation and outputs.

For each trial: build the world (data, split, model, shards) and place each site's shard on
its storage; open the trial (sites load, score and join with n_j); run each method's session;
evaluate the returned threshold on the test set; append the row to results.csv before the next
session. Site processes live across all trials of the run.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

from coordinator.adversary import Adversary
from coordinator.events import EventLog
from data.heterogeneity import shift_response
from protocol.accounting import Budget
from protocol.methods import METHODS, Outcome
from protocol.noise import NOT_PRIVATE
from protocol.wire import SHUFFLER_ID
from runner.federation import InProcessFederation, ProcessFederation
from runner.heterogeneity import HeterogeneityReport
from runner.outputs import RunDirectory
from runner.plots import learning_plot, run_plots
from runner.privacy import privacy_rows, privacy_summary, read_accounts, session_labels, write_privacy
from runner.report import communication, summarize
from runner.timeline import draw_timeline
from runner.trace import Timeline, write_trace
from scenarios.scenario import method_params
from sites.storage import remove_trial, write_trial
from stats.randomness import trial_rng
from transport.faults import resolve_rules
from transport.ledger import Ledger, read_ledger
from transport.security import generate_keys
from world.trial import TrialWorld, build_trial, site_ids

BACKENDS = ("processes", "inprocess")


class ResumeError(ValueError):
    """A run directory that cannot be resumed (no scenario, or a different one)."""


def run_study(scenario: dict, out: str | Path, *, backend: str = "processes", progress=None,
              keep_work: bool = False, resume: bool = False, external_sites: bool = False,
              on_listening=None, transcripts: list | None = None) -> dict:
    """Run `scenario` (already validated) into directory `out`; return the summary.

    resume: continue a run directory whose coordinator was killed: trials and methods already
    in results.csv are not run again, the rest run exactly as they would have (sessions and
    randomness are functions of the scenario, the trial and the method), and coordinator-kill
    faults that already fired do not fire again. external_sites: do not start site processes;
    wait for sites started by hand (`run.py site`), which build their own data. on_listening:
    called with the address the coordinator bound (its port chosen when runtime.bind ends in
    ':*') before any site is awaited. transcripts: a list that gets (trial, label, transcript)
    of every session (protocol.engine.PhaseRecord), for comparing backends in tests.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}")
    if scenario["faults"] and backend != "processes":
        raise ValueError("faults are applied by the process drivers; use the processes backend")
    if scenario["attacks"] and backend != "processes":
        raise ValueError("a scenario's attacks run over site processes: use the processes backend")
    rundir = RunDirectory(out)
    done: set[tuple[int, str]] = set()
    fired: set[int] = set()
    if resume:
        saved = rundir.read_scenario()
        if saved is None:
            raise ResumeError(f"{rundir.path} holds no scenario.yaml: nothing to resume")
        if saved != scenario:
            changed = sorted(k for k in set(saved) | set(scenario) if saved.get(k) != scenario.get(k))
            raise ResumeError(f"the scenario differs from the one {rundir.path} was started with "
                              f"(fields {', '.join(changed)}); resume with the same file and --set")
        rundir.repair()
        done = {(int(r["trial"]), r["method"]) for r in rundir.read_results()}
        fired = rundir.fired_faults()
    else:
        rundir.write_scenario(scenario)
    events = EventLog(rundir.events)
    ids = site_ids(scenario["sites"]["count"])
    methods = [(spec["label"], METHODS[spec["name"]](scenario["alpha"], **method_params(spec)))
               for spec in scenario["methods"]]
    adversary = (Adversary(scenario["attacks"], [label for label, _ in methods], scenario["seed"])
                 if scenario["attacks"] else None)
    if backend == "processes":
        runtime = scenario["runtime"]
        key_dir = None
        if runtime["security"] == "curve":
            # Only a local run's harness makes the sites' key pairs (its sites are processes of this
            # machine); site hosts started by hand and Ray hosts make their own and send the public
            # halves (transport.security), so the coordinator holds no site's secret key
            local_keys = not external_sites and runtime["launcher"]["kind"] == "local"
            key_dir = generate_keys(Path(runtime["keys"]) if runtime["keys"] else rundir.path / "keys",
                                    [*ids, SHUFFLER_ID] if local_keys else [SHUFFLER_ID])
        shuffled = any(method.codec_class().route == "shuffler" for _, method in methods)
        federation = ProcessFederation(ids, rundir.work, rundir.logs, events, runtime, Ledger(rundir.ledger),
                                       key_dir=key_dir, fault_rules=resolve_rules(scenario["faults"], ids, scenario["seed"], [label for label, _ in methods]),
                                       seed=scenario["seed"], fired=frozenset(fired), local_sites=not external_sites,
                                       shuffler=shuffled, budget=scenario["sites"]["budget"], scenario=scenario,
                                       policy=scenario["sites"]["policy"], adversary=adversary)
        if on_listening is not None:
            on_listening(federation.channel.endpoint)
    else:
        federation = InProcessFederation(ids, rundir.work, events, budget=scenario["sites"]["budget"],
                                         policy=scenario["sites"]["policy"], max_n=scenario["runtime"]["max_n"])
    if transcripts is not None:
        federation.transcripts = transcripts
    started = time.time()
    device = "cpu"
    # where the sites' privacy noise comes from, in words on every results row (protocol.policy)
    noise = NOT_PRIVATE if scenario["sites"]["policy"]["noise"] == "seeded" else "os"
    completed = 0
    report = HeterogeneityReport(scenario, _fedcp_qq_orders(scenario))
    site_devices: set[str] = set()
    try:
        present = federation.start()
        events.write("run_start", scenario=scenario["name"], backend=backend, sites=len(ids),
                     present=len(present), trials=scenario["trials"], resumed=resume,
                     already_done=len(done))
        for trial in range(scenario["trials"]):
            todo = [(index, label, method) for index, (label, method) in enumerate(methods)
                    if (trial, label) not in done]
            if not todo:
                completed += 1
                continue
            world = build_trial(scenario, trial)
            device = world.model.device
            if not external_sites:
                write_trial(rundir.work, trial, world.model, world.shards)
            if adversary is not None:  # what the scenario made: the attacks test releases against it
                adversary.truth = world.site_scores
            sizes, _ = federation.open_trial(trial, scenario["seed"])
            site_devices |= set(getattr(federation, "devices", {}).values())
            report.add(world, trial_rng(scenario["seed"], trial, "report"))
            for index, label, configured in todo:
                method = configured.for_trial(world.public)
                began = time.perf_counter()
                outcome = federation.run_method(trial, index, method, sizes, label)
                row = _result_row(trial, label, method, outcome, world, len(sizes),
                                  time.perf_counter() - began, noise)
                if "round_records" in outcome.details:  # federated learning: one row per round as well
                    rundir.append_rounds(round_rows(trial, label, outcome.details["round_records"], federation.ledger.rows))
                rundir.append_result(row)
                if progress is not None:
                    progress(trial, label, row)
            if not keep_work:
                remove_trial(rundir.work, trial)
            completed += 1
    finally:
        federation.close()
        events.write("run_end", trials_completed=completed, seconds=round(time.time() - started, 3))
        events.close()
    budget = Budget.from_spec(scenario["sites"]["budget"])
    spent = privacy_rows(read_accounts(rundir.work, ids, budget),
                         session_labels([label for label, _ in methods], scenario["trials"]))
    write_privacy(rundir.privacy, spent)
    summary = {
        "scenario": scenario["name"], "backend": backend, "alpha": scenario["alpha"],
        "trials": completed, "sites": len(ids), "device": device,
        "site_devices": sorted(site_devices) or [device], "heterogeneity": report.summary(),
        "security": scenario["runtime"]["security"] if backend == "processes" else "none",
        "seconds": round(time.time() - started, 3), "methods": summarize(rundir.read_results()),
        "communication": communication(read_ledger(rundir.ledger)), "events": events.counts,
        "privacy": privacy_summary(spent, budget, seeded=scenario["sites"]["policy"]["noise"] == "seeded"),
        "placement": getattr(federation, "placed", None),
    }
    if adversary is not None:  # what every attacked site did, and what each attack found
        attacks = [record.row() for record in adversary.records]
        rundir.write_attacks(attacks)
        summary["attacks"] = attacks
    rundir.write_summary(summary)
    try:
        run_plots(rundir.read_results(), scenario["alpha"], rundir.path)
        learning_plot(rundir.read_rounds(), rundir.path)
        write_timeline(rundir.path)
    except Exception as exc:  # a plot must never cost the results already written
        EventLog(rundir.events).write("plot_failed", reason=f"{type(exc).__name__}: {exc}")
    return summary


def write_timeline(path: Path, trial: int | None = None, png: Path | None = None) -> tuple[Path, Path, int]:
    """trace.json and a timeline PNG (default DIR/timeline.png) for `trial` (default: the first
    with a dropout, refusal or fault) from what run directory `path` holds."""
    timeline = Timeline.of(path)
    trial = timeline.troubled_trial() if trial is None else trial
    trace = write_trace(timeline, Path(path) / "trace.json")
    return trace, draw_timeline(timeline, trial, png or Path(path) / "timeline.png"), trial


def _fedcp_qq_orders(scenario: dict):
    """sizes -> the per-site orders of the scenario's FedCP-QQ plan (its first fedcp_qq entry, or
    the default planner), for proposition 3.4; None when no plan reaches 1 - alpha."""
    from protocol.methods.fedcp_qq import FedCPQQ

    spec = next((m for m in scenario["methods"] if m["name"] == "fedcp_qq"), {"name": "fedcp_qq"})
    method = FedCPQQ(scenario["alpha"], **{k: v for k, v in spec.items() if k in ("planner", "dropouts")})

    def orders(sizes):
        plan = method.make_plan(sizes)
        return None if plan is None or plan.infinite else list(plan.ells)

    return orders


def round_rows(trial: int, label: str, rounds: list[dict], ledger_rows: list[dict]) -> list[dict]:
    """rounds.csv rows of one learning session: the method's per-round record plus the wire bytes
    the ledger saw in that round's phase (processes backend; 0 in-process, which has no wire)."""
    wire: dict[tuple[str, str], int] = {}
    for row in ledger_rows:
        if str(row.get("trial")) == str(trial) and row.get("method") == label:
            key = (row["phase"], row["direction"])
            wire[key] = wire.get(key, 0) + int(row["bytes"])
    return [{"trial": trial, "method": label, **record,
             "wire_bytes_down": wire.get((f"round-{record['round'] - 1}", "down"), 0),
             "wire_bytes_up": wire.get((f"round-{record['round'] - 1}", "up"), 0)} for record in rounds]


def _result_row(trial: int, label: str, method, outcome: Outcome, world: TrialWorld, sites: int,
                seconds: float, noise: str = "os") -> dict:
    # paper 004's tests and estimates and paper 002's learning have no central prediction sets
    statistics = world.task == "two_sample" or world.model.data == "examples"
    coverage, size = (math.nan, math.nan) if statistics else _evaluate(outcome, world)
    details = outcome.details
    privacy = method.privacy
    score_range = method.score_range
    clipped = float(np.mean(world.calibration_scores > score_range[1])) if score_range else None
    reason = outcome.reason
    if clipped and details.get("top_bin"):
        reason = (reason + "; " if reason else "") + (
            f"the top bin was chosen while {clipped:.1%} of calibration scores exceed its edge "
            f"{score_range[1]:g}: the guarantee then holds for min(score, {score_range[1]:g})")
    return {
        "trial": trial, "method": label, "codec": method.codec, "status": outcome.status,
        "coverage": coverage, "size": size, "threshold": outcome.threshold,
        "guarantee": details.get("guarantee"), "ell": details.get("ell"), "k": details.get("k"),
        "sites": sites, "answered": details.get("answered"), "epsilon": privacy["epsilon"],
        "privacy": privacy["model"], "noise": noise, "epsilon_obtained": details.get("epsilon_obtained"),
        "epsilon_local": details.get("epsilon_local"),
        "quantile_error": _worst_quantile_error(details, method, world), "clipped": clipped,
        "p_value": details.get("p_value"), "statistic": details.get("statistic"),
        "accuracy": details.get("accuracy"), "accuracy_sd": details.get("accuracy_sd"),
        "global_accuracy": details.get("global_accuracy"), "proxy_accuracy": details.get("proxy_accuracy"),
        "set_coverage": details.get("set_coverage"),
        "estimates": json.dumps(details["estimates"]) if "estimates" in details else None,
        "estimate_errors": json.dumps(_estimate_errors(details["estimates"], world)) if "estimates" in details else None,
        "seconds": round(seconds, 6), "reason": reason, "details": extra_details(details),
    }


#: Outcome details the harness reads into results.csv's own columns (or rounds.csv, or uses itself)
READ_DETAILS = {"guarantee", "ell", "k", "answered", "epsilon_obtained", "epsilon_local", "p_value", "statistic",
                "accuracy", "accuracy_sd", "global_accuracy", "proxy_accuracy", "set_coverage", "estimates",
                "round_records", "quantile_indices", "included", "top_bin"}
DETAIL_LIMIT = 1000  # characters of JSON per value in the details column; a longer value is noted, not written


def extra_details(details: dict) -> str | None:
    """A method's other Outcome details (e.g. a plugin's `Outcome.ok(t, width=..., rounds=...)`), as the
    JSON object of results.csv's `details` column: numbers, strings, lists and maps as JSON (numpy
    values converted), a value over DETAIL_LIMIT characters replaced by a note of its size. None
    when there are none."""
    extra = {}
    for key in sorted(set(details) - READ_DETAILS):
        text = json.dumps(details[key], default=_plain, allow_nan=True)
        extra[key] = json.loads(text) if len(text) <= DETAIL_LIMIT else f"(omitted: {len(text)} characters of JSON)"
    return json.dumps(extra) if extra else None


def _plain(value):
    """json.dumps fallback: numpy scalars and arrays as Python numbers and lists, anything else as its repr."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value, key=str)
    return repr(value)


def _worst_quantile_error(details: dict, method, world: TrialWorld) -> float | None:
    """Paper 001 eq. (3), worst over the reported levels: |F(j*_p) - p| with F the true CDF of the
    included sites' scores on the method's bins (the simulation knows it; the coordinator does not)."""
    indices = details.get("quantile_indices")
    if not indices:
        return None
    from stats.ddg import flat_histogram

    included = details.get("included") or list(world.site_scores)
    values = np.concatenate([world.site_scores[s] for s in included])
    cdf = np.cumsum(flat_histogram(values, method.bins.edges)) / values.size
    return float(max(abs(cdf[j - 1] - float(p)) for p, j in indices.items()))


def _estimate_errors(estimates: dict[str, float], world: TrialWorld) -> dict[str, float] | None:
    """Paper 004 section 5.4: (Q-hat_p - Q_p) / sd per level, Q_p the p-quantile of the sites'
    mixture (eq. 13: site j's law weighted by n_j / N), taken from the unshifted test sample with
    each site's shift applied, and sd the test sample's (sqrt(r) for Gamma(r) data). None where
    the site laws are not known to the harness (heterogeneity other than none / location / scale)."""
    if world.heterogeneity not in ("none", "location", "scale") or world.y_test is None or len(world.y_test) < 2:
        return None
    reference = np.asarray(world.y_test, dtype=float)
    sizes = np.array([len(y) for _, y in world.shards.values()], dtype=float)
    laws = [shift_response(world.heterogeneity, reference, alpha) for alpha in world.shifts]
    values = np.concatenate(laws)
    weights = np.repeat(sizes / sizes.sum() / reference.size, reference.size)
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    sd = float(np.std(reference, ddof=1))
    errors = {}
    for level, estimate in estimates.items():
        truth = values[order][min(int(np.searchsorted(cumulative, float(level) - 1e-12)), values.size - 1)]
        errors[level] = (float(estimate) - float(truth)) / sd
    return errors


def _evaluate(outcome: Outcome, world: TrialWorld) -> tuple[float, float]:
    """Test-set coverage and mean size; with per-site thresholds (local calibration), the
    average over sites of each site's own prediction set."""
    if outcome.status == "aborted":
        return math.nan, math.nan
    thresholds = list(outcome.per_site.values()) if outcome.per_site else [outcome.threshold]
    results = []
    for threshold in thresholds:
        if math.isinf(threshold):
            results.append((1.0, math.inf))
            continue
        results.append(world.model.evaluate(world.test_base, world.y_test, threshold))
    return float(np.mean([c for c, _ in results])), float(np.mean([s for _, s in results]))
