"""gsd's advice re-applied to a cell's recorded draws: the cached advised ranking and feature probe read back as
:func:`gsd_cli.advice.decide.advise` reads them (the runner's deciders, :mod:`.stops`)."""

from __future__ import annotations


class _Row:
    def __init__(self, public: str, distance: float):
        self.public, self.distance = public, distance


class Ranking(list):
    """A cached advised ranking (``to_dict()``) read back as ``advise`` reads a ranking: rows best first (``public``,
    ``distance``), ``runs`` (each repeat's rows), ``dp``, ``privacy``."""

    def __init__(self, doc: dict, references: list | None = None):
        rows = sorted([*doc["results"], *(references or [])], key=lambda r: r["distance"])
        super().__init__(_Row(r["public"], r["distance"]) for r in rows)
        self.results = list(self)
        self.runs = [[_Row(p, d) for p, d in run["distances"].items()] for run in doc.get("runs") or []]
        self.dp, self.privacy = doc.get("dp", False), doc.get("privacy")

    @property
    def winner(self):
        return self[0]


def probe_result(doc: dict | None):
    """A cached feature probe (``<task>-s<seed>-probe.json``) as :class:`gsd_cli.advice.probe.ProbeResult`."""
    if doc is None:
        return None
    from gsd_cli.advice.probe import ProbeResult

    return ProbeResult(list(doc["baseline"]), {k: list(v) for k, v in doc["gains"].items()}, examples=doc["examples"],
                       model=doc["model"], stage1=doc.get("stage1", {}))


def advise(advised: dict, probe: dict | None, facts: dict, classes: int) -> tuple[str, str | None]:
    """``gsd train --auto-select``'s decision (``gsd_cli.advice.decide.advise(ranking, "auto", ...)``) on a cached
    advised ranking (the candidates and the in-run noise references, over its repeats), the candidates' public
    ``facts`` and, given one, the cached feature probe."""
    from gsd_cli.advice.decide import advise as gsd_advise

    a = gsd_advise(Ranking(advised["ranking"], advised.get("references")), method="auto", candidates=facts,
                   private_classes=classes, probe=probe_result(probe))
    return a.method, a.public
