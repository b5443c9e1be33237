"""What a catalogue run (:func:`gsd_cli.ranking.catalog.run_jobs`) writes and reports: its JSON and Markdown,
the failed checks of its jobs, the files rewritten after each job, and what its DP jobs spent together
per private data set (``privacy_total``)."""

from __future__ import annotations

from pathlib import Path


def catalog_privacy_total(results) -> dict:
    """What the DP jobs of a catalogue run spent, per private data set (``results``: ``[(job, ranking)]``):
    basic composition of pure DP (epsilons add; the jobs are separate releases about one data set,
    as ``gsd compare``'s runs). Private sets are grouped by identity (aliases and paths resolved,
    :func:`gsd_cli.data.identity.dataset_identity`; a job on a part ``:train`` counts toward the whole
    set). ``{}`` when no job was DP."""
    import math

    from ..data.identity import dataset_identity

    totals: dict = {}
    for job, rk in results:
        pv = getattr(rk, "privacy", None)
        if not pv:
            continue
        base = dataset_identity(rk.private)[0]
        t = totals.setdefault(base, {"private": base, "jobs": [], "total_epsilon": 0.0, "total_delta": 0.0, "dp": True})
        eps = float(pv.get("total_epsilon", pv.get("epsilon")))
        t["jobs"].append({"job": getattr(job, "name", str(job)), "epsilon": eps, "mechanism": pv.get("mechanism")})
        t["total_epsilon"] = math.fsum([t["total_epsilon"], eps])
        t["total_delta"] = math.fsum([t["total_delta"], float(pv.get("delta") or 0.0)])
        t["dp"] = t["dp"] and bool(getattr(rk, "dp", False))
    for t in totals.values():
        t["neighbouring"] = "add or remove one example"
        t["composition"] = f"basic composition of the {len(t['jobs'])} DP job(s) on this private set (epsilons add)"
    return totals


def run_json(run, failures: list[str] | None = None) -> str:
    """The JSON of a catalogue run: ``{"jobs": [...], "failures": [checks], "errors": [{"job", "error"}],
    "unusable_datasets": {name: error}}`` (``gsd rank --catalog --json``)."""
    import json

    from . import jobs_to_json

    doc = json.loads(jobs_to_json([(job.name, rk) for job, rk in run.results], failures))
    doc["errors"] = [{"job": job.name, "error": msg} for job, msg in run.errors]
    doc["unusable_datasets"] = dict(run.unusable)
    doc["privacy_total"] = catalog_privacy_total(run.results)  # per private set, as gsd compare's
    return json.dumps(doc, indent=2) + "\n"


def run_markdown(run, failures: list[str] | None = None) -> str:
    """The Markdown of a catalogue run: the finished jobs' tables and failed checks, then the failed jobs."""
    from . import to_markdown

    text = to_markdown([rk for _, rk in run.results], failures) if run.results else ""
    if run.errors:
        text += ("\n" if text else "") + "**Jobs that failed:**\n\n" + "".join(
            f"- `{job.name}`: {msg.replace('|', chr(92) + '|')}\n" for job, msg in run.errors)
    return text


def run_check_failures(run, fail_above: float | None = None, expect_best: str | None = None) -> list[str]:
    """The failed checks of the finished jobs (the flags win over a job's own checks)."""
    from ..ranking.checks import check_ranking

    failures = []
    for job, rk in run.results:
        failures += check_ranking(rk, fail_above if fail_above is not None else job.checks.get("fail_above"),
                                  expect_best if expect_best is not None else job.checks.get("expect_best"))
    return failures


def write_partial(run, json_file=None, csv_file=None, md_file=None, fail_above=None, expect_best=None) -> None:
    """Rewrite the outputs with the jobs finished so far (after each job, so a run that stops keeps
    them). Streams (``-``, a device or pipe) are written once, at the end, never here."""
    from . import jobs_to_csv, write_text

    def regular(p) -> bool:
        return p is not None and str(p) != "-" and (not Path(p).exists() or Path(p).is_file())

    failures = run_check_failures(run, fail_above, expect_best)
    has_checks = fail_above is not None or expect_best is not None or any(job.checks for job in run.jobs)
    if regular(json_file):
        write_text(json_file, run_json(run, failures))
    if regular(csv_file):
        write_text(csv_file, jobs_to_csv([(job.name, rk) for job, rk in run.results]))
    if regular(md_file):
        write_text(md_file, run_markdown(run, failures if has_checks else None))
