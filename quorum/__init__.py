"""Quorum's Python API, for notebooks and scripts (docs/api.md); `run.py` is a thin layer over it.

    import quorum

    scenario = quorum.load_scenario("scenarios/faults-site-crash.yaml", {"trials": 2})
    run = quorum.run(scenario, "runs/crash")          # backend="processes" (default) or "inprocess"
    run.results, run.ledger, run.events               # pandas DataFrames
    run.summary                                       # dict
    run.timeline(trial=1)                             # timeline.png of trial 1 (and trace.json)
    quorum.plan(alpha=0.1, sites=50, n=20)            # FedCP-QQ's orders and exact coverage

Site processes never re-run the caller's script, so no `if __name__ == "__main__":` guard is needed.
"""

from quorum._house import install

install()  # in a checkout: the house on the path, and quorum.protocol, ... the same modules as protocol, ...

# The API loads on first use (PEP 562), so that `import quorum.sites.host` in a site process costs
# no more than the site needs: the harness (pandas, plotting) is imported only by who calls it.
_API = {"plan": "quorum.planning", "Run": "quorum.runs", "RunDirectoryError": "quorum.runs",
        "open_run": "quorum.runs", "run": "quorum.runs", "sweep": "quorum.runs", "pool_plot": "quorum.runs",
        "Scenario": "quorum.scenario", "load_scenario": "quorum.scenario", "ScenarioError": "quorum.scenario",
        "predict": "quorum.runs", "fedscale_trace": "quorum.transport.links", "serve_sites": "quorum.hosting", "make_keys": "quorum.hosting", "site_ids_of": "quorum.hosting",
        "serve_shuffler": "quorum.hosting", "make_registry": "quorum.hosting"}

__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'quorum' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_API))
