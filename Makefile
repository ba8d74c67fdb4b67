# Two commands do everything on a fresh clone:
#   make demo   create .venv, install pinned dependencies, run scenarios/quickstart.yaml
#   make test   create .venv, install pinned dependencies, run the test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: paper000 demo test test-all bench bench-network-time bench-device-crossover paper001-fig2 paper001-fig3 paper002 paper002-baselines paper004 paper004-mwu paper003-fig3 clean

# Quorum itself is installed editable (so `import quorum` works from any directory, e.g. a
# notebook), and so is the example plugin (examples/quorum-bisection), so that its entry points
# are found and its tests run in `make test`: the plugin path cannot rot.
$(VENV)/.installed: requirements.txt pyproject.toml examples/quorum-bisection/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e . -e examples/quorum-bisection
	touch $@

demo: $(VENV)/.installed
	$(PY) run.py run scenarios/quickstart.yaml --out runs/quickstart-$$(date +%Y%m%d-%H%M%S)

# The suite mostly waits on sockets, processes and deadlines (load under 1 on two cores), so it
# runs on three pytest-xdist workers; files that share a costly module fixture or a machine-wide
# resource (Ray, network namespaces) keep to one worker each (their xdist_group mark).
test: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" -n 3 --dist loadgroup --durations=25

test-all: $(VENV)/.installed
	$(PY) -m pytest -q -n 3 --dist loadgroup

bench: $(VENV)/.installed
	$(PY) bench/plan_time.py
	$(PY) bench/comm_cost.py
	$(PY) bench/scoring_throughput.py
	$(PY) bench/secagg_sum.py
	$(PY) bench/paper004_quantiles.py

# network time against wall time (issue 50 point 4, docs/networks.md "Network time"): in-process on
# the virtual clock, 1,000 sites over 4G and 3G for 30 FedType rounds and 10,000 sites over broadband,
# 4G and 3G, and 100 sites over site processes in real time beside the same run in network time (about
# 5 min here): bench/results/network_time.json. ARGS=--quick for 100, 1,000 and 20 sites (about a minute,
# bench/results/network_time-quick.json)
bench-network-time: $(VENV)/.installed
	$(PY) bench/network_time.py $(ARGS)

# CPU or GPU (issue 51 point 3, docs/scale.md "CPU or GPU"): the model size at which CUDA overtakes
# the CPU (one thread, as a site process) for a site's scoring and training, MLP widths and CNN
# channels; CPU only where torch sees no GPU (the crossover then unmeasured): bench/results/device_crossover.json.
# ARGS=--quick for MLPs only (under a minute, bench/results/device_crossover-quick.json)
bench-device-crossover: $(VENV)/.installed
	$(PY) bench/device_crossover.py $(ARGS)

# paper 001 figure 2, all eight panels (4 estimators, epsilon 1..20, 100 runs) and the gap analysis
# (about 10 min here): runs/paper001-fig2/fig2.{json,png}, bench/results/paper001_fig2.json; ARGS=--quick
# for 10 runs (about a minute, bench/results left alone)
paper001-fig2: $(VENV)/.installed
	$(PY) bench/paper001_fig2.py --out runs/paper001-fig2 --results bench/results/paper001_fig2.json $(ARGS)

# paper 001 figure 3 (section 5, appendix B.3): FedAvg, Δ-FL, DP-FedAvg and DP-Δ-FL (flat and
# hierarchical) at epsilon 3..20, tuned on the validation clients, 5 runs each, by the fast
# in-process path (numpy on one thread a job; add ARGS=--quick for a few minutes):
# bench/results/paper001_fig3.{json,png}, docs/private-training.md
paper001-fig3: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) bench/paper001_fig3.py --jobs 2 $(ARGS)

# paper 000 (FedCP-QQ), every figure that can be had offline (issue 51): the theory figures 1, 2,
# 6, 7, proposition A.1 and theorem C.3 (exact), figure 3's intervals, figures 4 and 8-17 for ridge,
# the quantile forest (1,000 trees) and the CQR network, figure 18 (appendix B.2); 20 trials a
# figure as the paper (about 2.5 hours here: see docs/papers/000.md); ARGS=--quick (about 30 min here):
# the forest and the network 3 trials, forests of 100 trees (and 1,000 on the four smaller data sets),
# ridge 20. Resumable: finished runs in runs/paper000/ are reused, a stopped one continues;
# ARGS=--budget-minutes=N runs the cheapest unfinished paper-size runs for N minutes and labels each
# row with the size it ran at. Writes bench/results/paper000.json and docs/papers/000.md
paper000: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) bench/paper000.py $(ARGS)
	$(PY) bench/paper_pages.py write 000

# paper 002 (FedType), every table and figure with an offline stand-in (scenarios/paper002/):
# bench/results/paper002.json rendered into docs/papers/002.md: 30 rounds, 3 trials (about 71 min of
# one process here, table cost of the page); ARGS=--quick: 10 rounds, 1 trial (about 8-12 min at --jobs 1);
# ARGS="--quick --trials 3" (the committed numbers, 24 min); ARGS="... --experiment NAME" reruns some only.
# paper002-baselines: FedType against local-only, FedAvg, FML, FedProto in five Dirichlet regimes,
# 5 trials each (about 21 min here), bench/results/fedtype_baselines.json (docs/fedtype.md)
paper002: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) bench/paper002.py --jobs 2 $(ARGS)
	$(PY) bench/paper_pages.py write 002

paper002-baselines: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) bench/fedtype_baselines.py --trials 5 --jobs 2

# paper 004, every figure and table that can be had offline (figures 1-3 and S1, tables 1 and 3-7,
# section 5.3; issue 51): bench/paper004.py on the pure halves, 2,000 data sets a setting as in the
# paper (one process, about 35 min here; ARGS=--jobs 2 on a quiet machine, same results); ARGS=--quick
# for 200 (about 8 min); --sims / --qsims set the sizes. Writes bench/results/paper004.json
# and docs/papers/004.md (figure 2 in docs/papers/004_fig2.png)
paper004: $(VENV)/.installed
	$(PY) bench/paper004.py $(ARGS)

# paper 004 section 4.6 through the protocol (mwu_sites, mwu_table; sites and coordinator in-process),
# 100 trials a point over values of section 4.6's (delta, sigma_alpha, sigma_beta), and the quantile
# scenarios at r = 4 and 10 (about 20 min here): runs/paper004/mwu-*, runs/paper004/quantiles-*
paper004-mwu: $(VENV)/.installed
	for c in 3 5 10; do \
	  $(PY) run.py sweep scenarios/paper004/mwu-$$c-centres.yaml --backend inprocess --out runs/paper004/mwu-$$c \
	    --grid data.options.delta=0,0.05,0.1 --grid sites.heterogeneity.sigma=0.1,0.2 \
	    --grid sites.heterogeneity.sigma_treatment=0,0.05 || exit 1; \
	  $(PY) run.py run scenarios/paper004/quantiles-$$c-centres.yaml --backend inprocess \
	    --out runs/paper004/quantiles-$$c-r4 || exit 1; \
	  $(PY) run.py run scenarios/paper004/quantiles-$$c-centres.yaml --backend inprocess \
	    --set data.options.shape=10 --set sites.heterogeneity.sigma=0.0322 --out runs/paper004/quantiles-$$c-r10 || exit 1; \
	done

# paper 003 figure 3 on sklearn's digits: a DP-SGD (8, 1e-5) and a non-private CNN, each calibrated by
# split conformal and private_cp on the temperature-scaled softmax (T fitted on 200 rows held out of
# training, as the paper's code scales it), 5 model seeds x 200 splits (about 5 min here),
# bench/results/paper003_fig3.json
paper003-fig3: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) bench/paper003_fig3.py

# paper 003, everything offline (issue 51): figure 2 and theorems 2-3 / corollary 1 (theory, with
# Monte Carlo), figure 3 (bench/paper003_fig3.py, as paper003-fig3), figures 4-6's digits stand-in;
# writes bench/results/paper003.json and docs/papers/003.md (about 6.5 min here); ARGS=--quick: 20
# data sets and splits, figure 3 with 1 model seed (about 1.2 min, bench/results/paper003_fig3_quick.json)
.PHONY: paper003 paper001
paper003: $(VENV)/.installed
	OMP_NUM_THREADS=1 $(PY) bench/paper003.py $(ARGS)

# paper 001, figures 2 and 3 (issue 51): runs `make paper001-fig2` and `make paper001-fig3` (about 10
# and 18 min here) and writes bench/results/paper001.json and docs/papers/001.md, the claims against
# the detailed pages; ARGS=--quick runs their --quick versions (about 1 and 4 min) and keeps the
# summary on the committed full runs
paper001: $(VENV)/.installed
	$(PY) bench/paper001.py $(ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
