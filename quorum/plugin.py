"""Everything a plugin author needs, from one module (docs/plugins.md walks through it).

    from quorum.plugin import Method, CoordinatorHalf, SiteHalf, Send, Outcome, RequestError, Spend
    from quorum.plugin import Codec, PayloadError          # what a site may send
    from quorum.plugin import run_session, drive           # test the halves with no sockets

A method is a coordinator half (`start()` and `advance(phase, answers, dropped)`, each returning a
`Send` or an `Outcome`), a site half (`answer(phase, body)`, raising `RequestError` to refuse) and
a codec. Models and data sources are plugins too (`Model`, `DataSource`). Register a class with an
entry point in the group of its kind (`quorum.methods`, `quorum.codecs`, `quorum.models`,
`quorum.data`) or name it in a scenario by import path, `package.module:Class`.

`run.py new method NAME` writes a plugin package with a method, a codec, a scenario and a passing
test to start from.
"""

from __future__ import annotations

from data.sources import Dataset, DataSource
from models.base import Model
from protocol.accounting import Spend
from protocol.codecs.base import Codec, PayloadError
from protocol.inprocess import Ask, drive, run_session
from protocol.methods.base import (CoordinatorHalf, Method, OneShotMethod, Outcome, Planned,
                                          RequestError, Send, SiteHalf, Step)
from protocol.noise import PrivacyNoise, SeededNoise

#: the entry-point group of each kind of plugin (pyproject.toml: [project.entry-points."GROUP"])
GROUPS = {"method": "quorum.methods", "codec": "quorum.codecs", "model": "quorum.models", "data": "quorum.data"}

__all__ = ["Ask", "Codec", "CoordinatorHalf", "DataSource", "Dataset", "GROUPS", "Method", "Model", "OneShotMethod",
           "Outcome", "PayloadError", "Planned", "PrivacyNoise", "RequestError", "SeededNoise", "Send", "SiteHalf",
           "Spend", "Step", "drive", "run_session"]
