"""A Quorum plugin: split conformal prediction across sites by bisection on counts."""
