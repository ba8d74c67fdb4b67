"""Hypothesis runs seeded (derandomized, no example database) so that `make test` is the same run on
every machine; `HYPOTHESIS_PROFILE=explore` searches fresh inputs instead (docs/testing.md)."""

import os

from hypothesis import settings

settings.register_profile("seeded", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "seeded"))
