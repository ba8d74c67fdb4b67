"""Running scenarios from Python, and reading what a run wrote.

    run = quorum.run(scenario, backend="inprocess")      # or "processes" (the default)
    run.results        results.csv as a pandas DataFrame (one row per trial and method)
    run.ledger         ledger.csv: every message with its wire size and time
    run.events         events.jsonl: joins, dropouts, refusals, sessions, faults
    run.rounds         rounds.csv (federated learning), run.privacy: privacy.csv
    run.summary        summary.json as a dict
    run.trace          trace.json as a dict; run.timeline(trial) draws a trial's timeline PNG

The run directory is the one the CLI writes (`run.py run` is a thin layer over `run`);
`open_run(path)` reads any run directory, finished, killed or still going.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from quorum.scenario import Scenario, as_scenario
from runner.outputs import ResumeError, RunDirectory  # noqa: F401 (ResumeError: raised by run(resume=True))
from specs.schema import ScenarioError


class RunDirectoryError(ValueError):
    """A run directory that cannot be used as asked (already holds results, or not a run)."""


class Run:
    """A run directory, read lazily: each property reads its file when asked."""

    def __init__(self, path: str | Path, summary: dict | None = None) -> None:
        self.path = Path(path)
        if not (self.path / "scenario.yaml").exists():
            raise RunDirectoryError(f"{self.path} is not a run directory (no scenario.yaml)")
        self._summary = summary
        self._files = RunDirectory(self.path)

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    @property
    def scenario(self) -> Scenario:
        return Scenario.from_dict(self._files.read_scenario())

    @property
    def summary(self) -> dict:
        if self._summary is None:
            if not self._files.summary.exists():
                raise RunDirectoryError(f"{self.path} has no summary.json yet (the run has not finished)")
            self._summary = json.loads(self._files.summary.read_text())
        return self._summary

    @property
    def results(self):
        return _csv(self._files.results)

    @property
    def ledger(self):
        return _csv(self._files.ledger)

    @property
    def rounds(self):
        return _csv(self._files.rounds)

    @property
    def privacy(self):
        return _csv(self._files.privacy)

    @property
    def events(self):
        import pandas as pd

        lines = self._files.events.read_text().splitlines() if self._files.events.exists() else []
        records = []
        for line in lines:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:  # a torn last line of a killed run
                continue
        return pd.DataFrame.from_records(records, columns=None if records else ["ts", "event"])

    @property
    def trace(self) -> dict:
        path = self.path / "trace.json"
        if not path.exists():
            self.timeline()
        return json.loads(path.read_text())

    def report(self) -> list:
        """What the terminal shows of the run: each result family's table, the communication table,
        the sites' line, the privacy line and one line per attack (rich tables, and
        lines as rich Text, so that what a site sent is never read as markup)."""
        from runner.report import run_report

        return run_report(self.summary)

    def predict(self, *networks):
        """How long each method session would have taken over other networks, and the dropouts
        their deadlines would have caused, from this run's ledger (runner.predict), as a
        DataFrame: a row per session, its measured `seconds`, then `NAME s` and `NAME dropouts`
        per network. A network is a profile's name (every site on it), a `network:` section (a
        mapping) or a YAML file of one; nothing runs again."""
        import pandas as pd

        from runner.predict import predict_table

        return pd.DataFrame(predict_table(self.path, list(networks)))

    def timeline(self, trial: int | None = None, out: str | Path | None = None) -> Path:
        """Draw `trial`'s timeline (default: the first with a dropout, refusal or fault) to
        `out` (default DIR/timeline.png), rewriting DIR/trace.json; returns the PNG's path."""
        from runner.study import write_timeline

        return write_timeline(self.path, trial, Path(out) if out else None)[1]


def _csv(path: Path):
    import pandas as pd

    if not path.exists():
        return pd.DataFrame()
    return pd.read_csv(path, keep_default_na=True)


def open_run(path: str | Path) -> Run:
    return Run(path)


def default_directory(name: str, kind: str = "") -> Path:
    """runs/NAME-TIMESTAMP (runs/NAME-sweep-TIMESTAMP for a sweep), under the working directory."""
    return Path("runs") / f"{name}{'-' + kind if kind else ''}-{time.strftime('%Y%m%d-%H%M%S')}"


def run(scenario: "Scenario | dict | str | Path", out: str | Path | None = None, *, backend: str = "processes",
        resume: bool = False, keep_work: bool = False, progress=None, external_sites: bool = False,
        on_listening=None) -> Run:
    """Run a scenario (a Scenario, a mapping or a YAML path) into `out` (default
    runs/NAME-TIMESTAMP) and return the Run. backend: "processes" (sites in their own
    processes over ZeroMQ, faults applied) or "inprocess" (no sockets). resume: continue the
    run in `out` after its coordinator was killed. progress(trial, label, row): called as each
    session's row is written. external_sites / on_listening: as `run.py coordinator`, for sites
    started by hand; on_listening(endpoint) gets the address actually bound."""
    from runner.study import run_study

    scenario = as_scenario(scenario)
    check_backend(scenario, backend)
    out = Path(out) if out is not None else default_directory(scenario.name)
    if resume and not (out / "scenario.yaml").exists():
        raise RunDirectoryError(f"{out} holds no run to resume (no scenario.yaml)")
    if (out / "results.csv").exists() and not resume:
        raise RunDirectoryError(f"{out} already holds results.csv; choose another directory, or resume it (--resume; resume=True in Python)")
    summary = run_study(scenario.spec(), out, backend=backend, progress=progress, keep_work=keep_work,
                        resume=resume, external_sites=external_sites, on_listening=on_listening)
    return Run(out, summary)


def predict(run_dir: str | Path, *networks):
    """Run.predict on the run directory `run_dir` (finished, or killed: what its ledger holds)."""
    return Run(run_dir).predict(*networks)


def pool_plot(runs: list[str | Path], out: str | Path) -> tuple[Path, int]:
    """Pool the prediction sets of several run directories (e.g. one per data set) into one
    coverage and set-size box plot per method, one point per trial of each run (paper 000
    figure 4), written to the PNG `out`; returns its path and the number of rows pooled.
    ValueError when the runs use different alphas or no trial produced a prediction set."""
    from results.conformal import Threshold

    rows, alphas = [], set()
    for path in runs:
        run = Run(path)
        alphas.add(run.scenario["alpha"])
        rows += [r for r in run._files.read_results() if r.get("result") == Threshold.name]
    if len(alphas) > 1:
        raise ValueError(f"the runs use different alpha values {sorted(alphas)}; pool runs of one alpha")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not Threshold.plots(rows, out.parent, alphas.pop(), name=out.name):
        raise ValueError("no trial in these runs produced a prediction set")
    return out, len(rows)


def sweep_report(rows) -> list:
    """What the terminal shows of a sweep (sweep.csv as a DataFrame): a table per result family."""
    from runner.report import sweep_table

    swept = list(rows.columns[:list(rows.columns).index("method")])
    return sweep_table(rows.to_dict("records"), swept)


def check_backend(scenario: "Scenario", backend: str) -> None:
    """Refuse, before anything runs, what a backend cannot do. Both run faults, attacks and
    emulated networks (one pump: coordinator.driver); only a process can be killed and only
    processes sit behind the kernel's links, and site processes answer in real time."""
    if backend not in ("processes", "inprocess"):
        raise ScenarioError("backend", "'processes' or 'inprocess'", backend)
    spec = scenario.spec()
    if backend == "inprocess" and any(rule.action == "kill_coordinator" for rule in spec.fault_rules):
        raise ScenarioError("faults", "no kill_coordinator with backend='inprocess' (it ends the coordinator's "
                            "process): run with backend='processes'", "kill_coordinator")
    if backend == "inprocess" and spec.network.kernel:
        raise ScenarioError("network.mode", "emulated with backend='inprocess' (kernel links need site "
                            "processes): run with backend='processes'", "kernel")
    if backend == "processes" and spec.runtime.clock == "virtual":
        raise ScenarioError("runtime.clock", "auto or real with backend='processes' (site processes answer in real "
                            "time): run with backend='inprocess' for network time", "virtual")


def sweep(scenario: "Scenario | dict | str | Path", grid: dict | list, out: str | Path | None = None, *,
          backend: str = "processes", progress=None):
    """Run `scenario` over the product of `grid` ({dotted.key: [values]}, or `key=v1,v2`
    strings as `--grid` takes them) into `out` (default runs/NAME-sweep-TIMESTAMP); returns
    sweep.csv as a DataFrame (one row per combination and method; column `run` names each
    combination's run directory under `out`)."""
    from runner.sweep import parse_grid, run_sweep

    scenario = as_scenario(scenario)
    check_backend(scenario, backend)
    pairs = list(grid.items()) if isinstance(grid, dict) else parse_grid(list(grid))
    pairs = [(key, list(values)) for key, values in pairs]
    out = Path(out) if out is not None else default_directory(scenario.name, "sweep")
    if (out / "sweep.csv").exists():
        raise RunDirectoryError(f"{out} already holds sweep.csv; choose another directory")
    run_sweep(scenario.written(), pairs, out, backend=backend, progress=progress)
    return _csv(out / "sweep.csv")
