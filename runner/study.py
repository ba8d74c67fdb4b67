"""One run of a scenario: trials, sessions, evaluation and outputs.

The scenario is typed once (scenarios.spec.RunSpec); each part gets the value it needs. For
each trial: build the world (data, split, model, shards); open the trial on the federation (it
places each site's shard on its storage; sites load, score and join with n_j); run each method's
session; record its rows, whatever its result family (RunDirectory.record_session), before the
next session.
Site processes live across all trials of the run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Mapping

from coordinator.events import EventLog
from protocol.accounting import Budget
from runner.federation import FEDERATIONS
from runner import limits as machine_limits
from runner.devices import DeviceTally, count, session_device, training_counts
from runner.heterogeneity import HeterogeneityReport
from runner.outputs import ResumeError, RunDirectory  # noqa: F401 (ResumeError: the API's)
from runner.plots import run_plots
from runner.privacy import privacy_rows, privacy_summary, read_accounts, session_labels, write_privacy
from runner.report import WIRE_COLUMNS, communication, summarize, wire_rows
from runner.timeline import draw_timeline
from runner.trace import Timeline, write_trace
from scenarios.spec import RunSpec
from sites.storage import remove_trial
from stats.randomness import trial_rng
from transport.ledger import read_ledger
from world.trial import build_trial
from models.dp_sgd import model_summary

BACKENDS = tuple(FEDERATIONS)


def run_study(scenario: RunSpec | Mapping, out: str | Path, *, backend: str = "processes", progress=None,
              keep_work: bool = False, resume: bool = False, external_sites: bool = False,
              on_listening=None, transcripts: list | None = None) -> dict:
    """Run `scenario` (a typed run, or a validated scenario mapping, typed once here) into
    directory `out`; return the summary.

    resume: continue a run directory whose coordinator was killed: trials and methods already
    in results.csv are not run again, the rest run exactly as they would have (sessions and
    randomness are functions of the scenario, the trial and the method), and coordinator-kill
    faults that already fired do not fire again. external_sites: do not start site processes;
    wait for sites started by hand (`run.py site`), which build their own data. on_listening:
    called with the address the coordinator bound (its port chosen when runtime.bind ends in
    ':*') before any site is awaited. transcripts: a list that gets (trial, label, transcript)
    of every session (protocol.engine.PhaseRecord), for comparing backends in tests.
    """
    run = RunSpec.of(scenario)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}")
    if backend == "processes" and run.runtime.clock == "virtual":
        raise ValueError("runtime.clock virtual needs the inprocess backend: site processes answer in real time "
                         "(run.py run --backend inprocess, or runtime.clock: auto)")
    if run.network.kernel:
        kernel_links_possible(run, external_sites)
    dp_sgd = run.world.model.get("dp_sgd")
    if external_sites and dp_sgd and dp_sgd["noise"] == "os":
        raise ValueError("model.dp_sgd.noise is os: sites started by hand rebuild each trial's model from the seed "
                         "and would train another model than the study's; use model.dp_sgd.noise: seeded (not private)")
    if backend == "processes":  # before anything is written: can this machine hold the run's connections?
        machine_limits.check(len(run.site_ids), shuffled=run.shuffled, bind=run.runtime.bind,
                             sites_per_process=run.runtime.sites_per_process,
                             local_sites=not external_sites and run.runtime.launcher["kind"] == "local")
    study = Study(run, RunDirectory(out, families=run.families), backend, resume, external_sites)
    if on_listening is not None and backend == "processes":
        on_listening(study.federation.channel.endpoint)
    study.federation.transcripts = transcripts
    return study.execute(progress, keep_work)


def kernel_links_possible(run: RunSpec, external_sites: bool) -> None:
    """Before anything is written: can this run put its sites behind kernel links? (else
    KernelLinksUnavailable, saying why and what to do)."""
    from transport.kernel_links import KernelLinksUnavailable, kernel_problem

    if external_sites or run.runtime.launcher["kind"] != "local":
        raise KernelLinksUnavailable("network.mode: kernel puts the site processes this machine starts behind "
                                     "kernel links: it needs the local launcher (runtime.launcher.kind: local) "
                                     "and sites started by the run, not by hand")
    problem = kernel_problem(run.network)
    if problem:
        raise KernelLinksUnavailable(f"network.mode: kernel cannot run on this machine: {problem}; "
                                     "use network.mode: emulated (the default)")


class Study:
    """One run in its directory: the federation its backend needs, and what the run reports."""

    def __init__(self, run: RunSpec, rundir: RunDirectory, backend: str, resume: bool, external_sites: bool) -> None:
        self.run, self.rundir, self.backend = run, rundir, backend
        self.done, fired = rundir.begin(run.mapping, resume)
        self.report = HeterogeneityReport(run.world.heterogeneity, run.alpha, *run.fedcp_qq_planner)
        self.resumed, self.external_sites = resume, external_sites
        self.federation = FEDERATIONS[backend](run, rundir, fired=frozenset(fired), external_sites=external_sites)
        self.events = self.federation.events
        self.model_device, self.site_devices = "cpu", set()
        self.devices = DeviceTally()  # where sites scored, the harness trained and sites trained (runner.devices)
        self.model_training: list[dict | None] = []  # each trial's model: DP-SGD's record or None (models.dp_sgd)
        self.started, self.completed = time.time(), 0

    def execute(self, progress, keep_work: bool) -> dict:
        run, events = self.run, self.events
        try:
            present = self.federation.start()
            events.write("run_start", scenario=run.name, backend=self.backend, sites=len(run.site_ids),
                         present=len(present), trials=run.trials, resumed=self.resumed, already_done=len(self.done),
                         cores=os.cpu_count())
            for trial in range(run.trials):
                todo = [(index, label, method) for index, (label, method) in enumerate(run.methods)
                        if (trial, label) not in self.done]
                if todo:
                    self.trial(trial, todo, progress, keep_work)
                self.completed += 1
        finally:
            self.federation.close()
            events.write("run_end", trials_completed=self.completed, seconds=round(time.time() - self.started, 3))
            events.close()
        return self.finish()

    def trial(self, trial: int, todo, progress, keep_work: bool) -> None:
        """One trial: build its world, open it on the federation (each site's shard placed on its
        storage; sites load, score and join with n_j), then run each method's session and record
        its rows."""
        world = build_trial(self.run.world, trial)
        self.model_device = world.model.device
        self.model_training.append(getattr(world.model, "training_privacy", None))
        sizes = self.federation.open_trial(trial, world)
        self.site_devices |= set(self.federation.devices.values())
        scoring, model_training = count(self.federation.devices), world.model.training_device
        self.devices.trial(self.federation.devices, model_training)
        self.report.add(world, trial_rng(self.run.seed, trial, "report"))
        for index, label, configured in todo:
            method = configured.for_trial(world.public)
            began = time.perf_counter()
            outcome = self.federation.run_method(trial, index, method, sizes, label)
            row = self.rundir.record_session(trial, label, method, outcome, world,
                                             self.federation.ledger.session_wire(trial, label),
                                             sites=len(sizes), seconds=time.perf_counter() - began,
                                             noise=self.run.noise,
                                             device=session_device(scoring, model_training,
                                                                   training_counts(outcome.details)))
            self.devices.session(label, training_counts(outcome.details))
            if progress is not None:
                progress(trial, label, row)
        if not keep_work:
            remove_trial(self.rundir.work, trial)

    def finish(self) -> dict:
        """What the run spent (privacy.csv), its summary (summary.json), its attacks and plots."""
        run, rundir = self.run, self.rundir
        budget = Budget.from_spec(run.budget)
        spent = privacy_rows(read_accounts(rundir.work, run.site_ids, budget), session_labels(run.labels, run.trials))
        write_privacy(rundir.privacy, spent)
        ledger = read_ledger(rundir.ledger)
        rundir.write_wire(wire_rows(ledger), WIRE_COLUMNS)
        summary = {
            "scenario": run.name, "backend": self.backend, "alpha": run.alpha, "trials": self.completed,
            "sites": len(run.site_ids), "device": self.model_device,
            "site_devices": sorted(self.site_devices) or [self.model_device], "devices": self.devices.summary(),
            "heterogeneity": self.report.summary(),
            "security": run.runtime.security if self.backend == "processes" else "none",
            "seconds": round(time.time() - self.started, 3), "methods": summarize(rundir.read_results()),
            "communication": communication(ledger), "events": self.events.counts,
            "privacy": privacy_summary(spent, budget, seeded=run.seeded_noise),
            "model": {**model_summary(run.world.model["kind"], self.model_training, run.world.model.get("dp_sgd")),
                      "calibration": [{"method": label, "epsilon": method.privacy["epsilon"],
                                       "privacy": method.privacy["model"]} for label, method in run.methods]},
            "placement": getattr(self.federation, "placed", None),
            "network": {**run.network.describe(), **({"kernel_links": self.federation.kernel.describe()}
                                                      if getattr(self.federation, "kernel", None) else {})},
        }
        attacks = self.federation.attack_rows()  # what every attacked site did, and what each attack found
        if attacks is not None:
            rundir.write_attacks(attacks)
            summary["attacks"] = attacks
        summary = rundir.write_summary(summary)  # as written: what a peer chose in it made inert
        try:
            run_plots(rundir, run.alpha)
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
