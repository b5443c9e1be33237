"""Round 6's data (issue 52): images from packages no earlier round used (:mod:`.prepare6`, ``SOURCES.md``); its
protocol was frozen in ``split6.json`` before the first run; its spec is ``../rounds/round6.json`` and it runs and
scores as every round does (``python -m benchmarks validity --round 6 prepare|tune|run|status|score``)."""
