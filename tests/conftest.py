"""Hypothesis runs seeded (derandomized, no example database) so that `make test` is the same run on
every machine; `HYPOTHESIS_PROFILE=explore` searches fresh inputs instead (docs/testing.md)."""

import multiprocessing
import os

import pytest
from hypothesis import settings

settings.register_profile("seeded", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "seeded"))


@pytest.fixture
def fork_server_preloaded():
    """For a test that starts the secure sum's unmasking worker (protocol.secagg.unmasking, forked
    from this process's fork server, which starts with it): a later test in the same process
    whose site hosts fork from that server (runner.processes) would find its preload unset (it
    can only be set before the server starts), and each site process would import every module
    itself, seconds each, past a scenario's join deadline ("0 joined"). Set it first, as the
    runner does."""
    from runner.processes import PRELOAD

    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
