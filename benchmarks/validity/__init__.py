"""Helpers of ``benchmarks/bench_validity.py``: the tasks, the cached downstream trainings, the
predictors and their scores (issue 24)."""
