"""gsd's benchmarks, one package with one entry point (issue 51): ``python -m benchmarks --help`` lists
every benchmark with a line from its docstring, ``python -m benchmarks NAME [ARGS...]`` runs one with its
own options (from the repository's root). :mod:`.harness` holds what they share: the environment record
every result carries, the results file and the common options.

Nothing is imported here: listing the benchmarks reads their files, and a benchmark's imports happen
when it runs.
"""
