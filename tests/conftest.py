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


@pytest.fixture
def one_torch_thread():
    """One torch thread for training in the test's own process, as a site process trains
    (models.torch_nets, sites.local.one_torch_thread): beside `make test`'s other workers on two
    cores, torch's default of a thread per core made each worker's threads wait on the others'
    (tests/test_models.py's three torch tests took 100-130 s each in a busy suite, 5-20 s alone),
    and the reductions' order is the same every run. A module uses it with
    `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
