"""The held-out benchmark (issues 42, 52, 62): does following ``gsd train --auto-select`` give a better private
model than training without public data, on tasks that chose none of gsd's settings?

Each round is data: a spec (``rounds/round<N>.json``, :mod:`.spec`: its tasks and candidates, data builder, seeds,
budget, training settings, tuning grid, steps, deciding arms, figure sets, targets) and its frozen results
(``benchmarks/results/<results>/``, :mod:`.results`: the trainings, the steps' records, the decisions), with a
pre-registration file committed before its first run (``split<N>.json``; from round 7 written by ``freeze``). One
runner (:mod:`.run`, through gsd's library) and one scorer (:mod:`.score`, :mod:`.report`: no gsd, no training)
serve every round::

    python -m benchmarks validity --round N prepare       # the npz files (benchmark-only packages: the data builder)
    python -m benchmarks validity --round N freeze        # once, before the first run (a round without a split file)
    python -m benchmarks validity --round N tune|run [--part I/N]   # resumable, keyed by (task, arm, seed)
    python -m benchmarks validity --round N status        # complete and missing cells, from the results alone
    python -m benchmarks validity --round N score [--partial] [--update-package]   # benchmarks/results/<out>.{json,md}

Rounds 1-5's data: :mod:`.prepare`; round 6's: :mod:`.round6.prepare6` (``round6/SOURCES.md``). :mod:`.stops` replays
issue 53's repeat rule on the recorded draws (``python -m benchmarks validity.heldout.stops``).

Import order (no circles): spec <- results <- score <- report; results <- replay, run <- stops; __main__.
"""
