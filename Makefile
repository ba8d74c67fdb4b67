# Two commands do everything on a fresh clone:
#   make demo   create .venv, install pinned dependencies, run scenarios/quickstart.yaml
#   make test   create .venv, install pinned dependencies, run the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-all bench paper001-fig2 clean

$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

demo: $(VENV)/.installed
	$(PY) run.py run scenarios/quickstart.yaml --out runs/quickstart-$$(date +%Y%m%d-%H%M%S)

test: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow"

test-all: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) bench/plan_time.py
	$(PY) bench/comm_cost.py
	$(PY) bench/scoring_throughput.py
	$(PY) bench/secagg_sum.py
	$(PY) bench/paper004_quantiles.py

paper001-fig2: $(VENV)/.installed
	$(PY) bench/paper001_fig2.py --out runs/paper001-fig2

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
