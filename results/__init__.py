"""Result families: what a session returns and how the harness writes it (results.base).

A family is a class named by an import path, like methods and codecs: Quorum's own are listed here;
another package's are entry points in the group `quorum.results`, or the import path its method
names (`result = "mylab.results:Interval"` or the class itself). results.csv's `result` column
names each row's family, so that a run directory can be summarized again from its rows alone.
"""

from results.base import HEAD_COLUMNS, STATUSES, TAIL_COLUMNS, Outcome, Truth
from specs.plugins import Registry, subclass_problem


def check_result(cls: type) -> str | None:
    """What keeps `cls` from being a result family (None: nothing)."""
    problem = subclass_problem(cls, Outcome)
    if problem:
        return problem
    if not isinstance(cls.COLUMNS, tuple) or not all(isinstance(c, str) for c in cls.COLUMNS):
        return f"COLUMNS must be a tuple of column names, got {cls.COLUMNS!r}"
    taken = set(cls.COLUMNS) & set(HEAD_COLUMNS + TAIL_COLUMNS)
    if taken:
        return f"COLUMNS {sorted(taken)} are every row's own (results.base.HEAD_COLUMNS, TAIL_COLUMNS)"
    return None


RESULTS = Registry("result family", "quorum.results", {
    "outcome": "results.base:Outcome",
    "conformal": "results.conformal:Threshold",
    "test": "results.hypothesis:HypothesisTest",
    "estimates": "results.estimates:Estimates",
    "learning": "results.learning:LearningRun",
    "robust_training": "results.robust_training:RobustTraining",
}, key="name", check=check_result)


def family_name(family: type[Outcome]) -> str:
    """How results.csv names a family: its registered name, or its import path when it is not
    registered under that name (a plugin's family named by path), so that RESULTS.load finds it."""
    if family.name in RESULTS and RESULTS[family.name] is family:
        return family.name
    return f"{family.__module__}:{family.__qualname__}"


def result_columns(families) -> list[str]:
    """results.csv's header for a run whose methods return these families: every row's own
    columns around each family's own, in the order the families first appear."""
    own = []
    for family in families:
        own += [column for column in family.COLUMNS if column not in own]
    return [*HEAD_COLUMNS, *own, *TAIL_COLUMNS]


__all__ = ["RESULTS", "STATUSES", "Outcome", "Truth", "check_result", "family_name", "result_columns"]
