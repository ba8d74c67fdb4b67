"""The papers' statistics, on the ground floor: pure functions of their arguments (randomness
comes in as a numpy Generator), importing only numpy, scipy, the standard library and each
other. Nothing here knows about messages, sites or processes; the methods in protocol.methods
call these functions from their coordinator and site halves.

  conformal        order statistics, split conformal prediction (paper 000, sections 2-3)
  orderstats       exact coverage of the quantile of quantiles (paper 000, theorem 3.2, eq. 5)
  unbalanced       the same for unequal site sizes (paper 000, appendix A.1)
  poissonbinomial  the Poisson-binomial law that appendix A.1's coverage integrates
  ehm              its distance to the binomial and Ehm's bounds (paper 000, theorem C.3)
  planner          choosing the orders (paper 000, eq. 6), robustness, re-planning after dropouts
  optimizer        per-site orders closest to 1 - alpha from above (beyond paper 000)
  dp               exponential-mechanism quantiles over bins (paper 000 algorithm 2, paper 003)
  amplification    privacy amplification by shuffling (Feldman, McMillan and Talwar 2021)
  ddg              distributed discrete Gaussian quantiles and their accounting (paper 001)
  kanon            K-anonymous federated summary tables (paper 004, section 3)
  mannwhitney      federated Mann-Whitney U tests (paper 004, section 4)
  fedquantiles     federated quantile estimators from tables and moments (paper 004, section 5)
  randomness       Generators derived from the scenario seed (shared with every layer above)
"""
