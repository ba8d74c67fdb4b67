"""Quorum's Python API, for notebooks and scripts (docs/api.md); `run.py` is a thin layer over it.

    import quorum

    scenario = quorum.load_scenario("scenarios/faults-site-crash.yaml", {"trials": 2})
    run = quorum.run(scenario, "runs/crash")          # backend="processes" (default) or "inprocess"
    run.results, run.ledger, run.events               # pandas DataFrames
    run.summary                                       # dict
    run.timeline(trial=1)                             # timeline.png of trial 1 (and trace.json)
    quorum.plan(alpha=0.1, sites=50, n=20)            # FedCP-QQ's orders and exact coverage

A script that uses the processes backend must guard its top level with
`if __name__ == "__main__":` (site processes start from a fork server that imports it).
"""

from quorum.planning import plan
from quorum.runs import Run, RunDirectoryError, open_run, run, sweep
from quorum.scenario import Scenario, load_scenario
from specs.schema import ScenarioError

__all__ = ["Run", "RunDirectoryError", "Scenario", "ScenarioError", "load_scenario", "open_run", "plan", "run",
           "sweep"]
