"""Everything a plugin author needs, from one module (docs/plugins.md walks through it).

    from quorum.plugin import Method, CoordinatorHalf, SiteHalf, Send, Outcome, RequestError, Spend
    from quorum.plugin import Codec, PayloadError          # what a site may send
    from quorum.plugin import Threshold, HypothesisTest, Estimates, LearningRun   # result families
    from quorum.plugin import run_session, drive           # test the halves with no sockets

A method is a coordinator half (`start()` and `advance(phase, answers, dropped)`, each returning a
`Send` or an `Outcome`), a site half (`answer(phase, body)`, raising `RequestError` to refuse) and
a codec. Its result is an Outcome of a result family (`Threshold`, `HypothesisTest`, `Estimates`,
`LearningRun`, or a family of its own: a subclass of `Outcome` owning its columns, summary, table
and plots, named in the method's `result`). Models and data sources are plugins too (`Model`,
`DataSource`). Register a class with an entry point in the group of its kind (`quorum.methods`,
`quorum.codecs`, `quorum.models`, `quorum.data`, `quorum.results`) or name it in a scenario by
import path, `package.module:Class`.

`run.py new method NAME` writes a plugin package with a method, a codec, a scenario and a passing
test to start from.
"""

from __future__ import annotations

from data.sources import Dataset, DataSource
from models.base import Model
from protocol.accounting import Spend
from protocol.codecs.base import Codec, PayloadError
from protocol.inprocess import Ask, drive, run_session
from protocol.methods.base import (CoordinatorHalf, Method, OneShotMethod, Planned, RequestError, Send,
                                   SiteHalf, Step, checked)
from protocol.noise import PrivacyNoise, SeededNoise
from protocol.phases import Phase, PhaseStep, PhaseTable
from results.base import Outcome, Truth, fmt, mean_of, numbers, over_ok
from results.conformal import Threshold
from results.estimates import Estimates
from results.hypothesis import HypothesisTest
from results.learning import LearningRun

#: the entry-point group of each kind of plugin (pyproject.toml: [project.entry-points."GROUP"])
GROUPS = {"method": "quorum.methods", "codec": "quorum.codecs", "model": "quorum.models", "data": "quorum.data",
          "result": "quorum.results"}

__all__ = ["Ask", "Codec", "CoordinatorHalf", "DataSource", "Dataset", "Estimates", "GROUPS", "HypothesisTest",
           "LearningRun", "Method", "Model", "OneShotMethod", "Outcome", "PayloadError", "Phase", "PhaseStep",
           "PhaseTable", "Planned", "PrivacyNoise", "RequestError", "SeededNoise", "Send", "SiteHalf", "Spend",
           "Step", "Threshold", "Truth", "checked", "drive", "fmt", "mean_of", "numbers", "over_ok", "run_session"]
