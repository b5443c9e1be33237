"""Round 6 of the held-out benchmark (issue 52): eight new tasks from data that ships in packages no earlier round
used (:mod:`.prepare6`, ``SOURCES.md``), pre-registered in ``split6.json`` (:mod:`.protocol`) before the first run,
run through gsd's library (:mod:`.run6`) and scored against the pass/fail rule (:mod:`.score6`). From ``benchmarks/``::

    python -m validity.heldout.round6.prepare6         # the npz files (benchmark-only packages, SOURCES.md)
    python -m validity.heldout.round6 split6           # once, before any run: the protocol, frozen
    python -m validity.heldout.round6 tune [--part 1/2] # the lr x epochs grid on split.json's selection tasks
    python -m validity.heldout.round6 run [--part 1/2]  # every cell: DP-SGD, the second phase per candidate, both advices
    python -m validity.heldout.round6 score            # benchmarks/results/heldout6_scores.{json,md}

Import order (no circles): prepare6 <- protocol <- run6 <- score6 <- __main__.
"""
