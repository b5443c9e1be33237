"""What the order of a GSD ranking is worth, as measured: a note under the table (``gsd rank --validity``), from the figures of
the held-out benchmark's pre-registered rounds (``benchmarks/validity/heldout``, issues 42 and 52) shipped in
the package as ``heldout.json`` (written by ``python -m benchmarks validity --round 5 score --update-package``; nothing here
is hard-coded). ``validity.json`` (``benchmarks/bench_downstream.py score --update-package``, issue 33) still
ships the previous rule's thresholds (:mod:`gsd_cli.advice.fallback`); its in-sample figures are no longer printed."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from ..defaults import ADVICE


@lru_cache(maxsize=None)
def _shipped(name: str) -> dict | None:
    """A JSON file shipped in gsd_cli.report, or None when it is missing or unreadable (then nothing is printed)."""
    try:
        return json.loads(resources.files("gsd_cli.report").joinpath(name).read_text())
    except (OSError, ValueError):
        return None


def figures() -> dict | None:
    """The previous rule's shipped figures (``validity.json``)."""
    return _shipped("validity.json")


def heldout() -> dict | None:
    """The held-out benchmark's shipped figures (``heldout.json``: rounds 2-5)."""
    return _shipped("heldout.json")


def heldout6() -> dict | None:
    """Round 6's shipped figures (``heldout6.json``: ``python -m benchmarks validity --round 6 score --update-package``)."""
    return _shipped("heldout6.json")


def heldout7() -> dict | None:
    """Round 7's shipped figures (``heldout7.json``: ``python -m benchmarks validity --round 7 score --update-package``)."""
    return _shipped("heldout7.json")


def round7_sentence(doc: dict) -> str:
    """Round 7's figures, size by size: whether public data paid (the oracle chosen on other seeds gaining 3 points or
    more), then each advice against the best arm without a candidate and GSD's order (the formats of the markdown)."""
    def arm(x: dict | None, what: str) -> str:
        if not x:
            return ""
        return (f"; {what} within 0.5 points in {x['no_harm']} of {x['cells']} cells, mean gain {_ci(x['gain'], '+.2f')} "
                f"points" + (f", {_pct(x['oracle_share'])} of the oracle's" if x["oracle_share"].get("mean") is not None else ""))

    parts = []
    for st in doc["sets"].values():
        lo = st["oracle_loso"]
        pays = {True: "paid", False: "did not pay", None: "was not tested"}[st["pays"]]  # the round's own gate
        rho = st.get("spearman_gsd")
        parts.append(
            f"at {', '.join(f'{n:,}' for n in st['sizes'])} private examples ({lo['of']} tasks) public data {pays}: the oracle "
            f"chosen on other seeds gained 3 points or more on {lo['gaining_3']} of {lo['of']} tasks (mean {_ci(lo['gain'], '+.2f')})"
            + arm(st.get("non_private"), "gsd train --auto-select --weights (not DP)")
            + _refused(st)
            + arm(st.get("dp"), f"with --select-epsilon {doc['select_epsilon']:g} (DP, the same total)")
            + (f" (it chose no candidate in {st['dp']['dpsgd_by_choice']} of them)" if st.get("dp") else "")
            + (f"; GSD's order against the second phase, mean Spearman {_ci(rho, '+.2f')}" if rho else ""))
    missed = f"; targets missed: {', '.join(doc['missed'])}" if doc["missed"] else "; every scored target met"
    return (f"validity ({doc['label']}; epsilon {doc['epsilon']:g}; gains over the best arm without a candidate, DP-SGD "
            f"from scratch or from the base; intervals: {doc['intervals']}): " + "; ".join(parts) + missed + ".")


def _refused(st: dict) -> str:
    """How often the advice's eligibility rule kept the feature probe's top candidate out, and what that candidate
    gained when always used (the scorer's ``probe-pick``: neither the rule nor the advice's tests applied; round 7's
    finding, absent from notes that predate it)."""
    r, p = st.get("pick_refused"), st.get("probe_pick")
    if not (r and p):
        return ""
    return (f" (its eligibility rule kept the feature probe's top candidate out in {r['cells']} of {r['of']} cells; "
            f"the probe's top candidate, always used: mean gain {_ci(p['gain'], '+.2f')} points, {_pct(p['oracle_share'])} of the oracle's)")


def round6_sentence(doc: dict) -> str:
    """Round 6's figures: the non-private advice and the DP advice at the same total epsilon, each against DP-SGD
    tuned over learning rate and length (the formats of the round's markdown)."""
    p, d = doc["non_private"], doc["dp"]
    b = doc["baseline"]["tuned"]

    def arm(x: dict) -> str:
        return (f"within 0.5 points of DP-SGD in {x['no_harm']} of {x['cells']} cells ({x['dpsgd_by_choice']} by choosing DP-SGD), "
                f"mean gain over tasks {_ci(x['gain'], '+.2f')} points, {_pct(x['oracle_share'])} of the oracle's")

    missed = f"; targets missed: {', '.join(doc['missed'])}" if doc["missed"] else "; every target met"
    return (f"validity ({doc['label']}, {doc['tasks']} tasks; DP-SGD tuned over {doc['baseline']['grid']}: lr {b['lr']:g}, "
            f"{b['epochs']} epochs; intervals: {doc['intervals']}): "
            + (f"the oracle (the best choice in hindsight) gained {_ci(doc['oracle_gain'], '+.2f')} points; " if doc.get("oracle_gain") else "")
            + f"gsd train --auto-select (not DP) {arm(p)}; with "
            f"--select-epsilon {doc['select_epsilon']:g} at the same total epsilon (DP) {arm(d)}{missed}.")


def _ci(d: dict, fmt: str) -> str:
    ci = d.get("ci")
    return f"{d['mean']:{fmt}}" + (f" [{ci[0]:{fmt}}, {ci[1]:{fmt}}]" if ci else "")


def _pct(d: dict) -> str:
    ci = d.get("ci")
    return f"{100 * d['mean']:.0f}%" + (f" [{100 * ci[0]:.0f}%, {100 * ci[1]:.0f}%]" if ci else "")


def heldout_sentence(doc: dict, lead: str = "validity") -> str:
    """The pre-registered rounds' figures, then the later rounds' apart (the formats of the scorer's markdown);
    ``lead``: the sentence's first word."""
    p, q = doc["pre_registered"], doc["later"]
    probe = f" (the feature probe's {_ci(p['spearman_probe'], '+.2f')})" if p.get("spearman_probe") else ""
    span = "rounds {}-{}".format
    return (f"{lead} (held-out benchmark, pre-registered {span(*p['rounds'])}: {len(p['tasks'])} tasks; intervals: "
            f"{doc['intervals']}): GSD's order against second-phase accuracy, mean Spearman {_ci(p['spearman_gsd'], '+.2f')}{probe}. "
            f"gsd train --auto-select was within 0.5 points of DP-SGD (tuned over {len(doc['baseline']['lrs'])} learning rates "
            f"at {doc['baseline']['epochs']} epochs) in {p['cells_ok']} of {p['cells']} cells, {p['dpsgd_by_choice']} of them by "
            f"choosing DP-SGD itself (always DP-SGD: {p['always_dpsgd_ok']} of {p['cells']}); mean gain over tasks "
            f"{_ci(p['gain'], '+.1f')} points, {_pct(p['oracle_share'])} of the oracle's, {100 * p['top_two_share']:.0f}% of the gain "
            f"from {' and '.join(p['top_two'])}. {span(*q['rounds']).capitalize()}, designed after that miss: {q['cells_ok']} of "
            f"{q['cells']} cells ({q['dpsgd_by_choice']} by choice), mean gain {_ci(q['gain'], '+.1f')} points.")


def _span(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:+.2f}" if abs(hi - lo) < 0.005 else f"{lo:+.2f} to {hi:+.2f}"


def validity_line(metric: str = "gsd") -> str | None:
    """The note under a GSD table: GSD's Spearman with downstream accuracy and what gsd train --auto-select gained
    on the held-out benchmark's pre-registered rounds (the later rounds apart), then the advice. None for other
    metrics, or when the figures are not shipped."""
    doc = heldout()

    if metric in ("dp-energy", "dp-select"):  # a private selection: what auto-select does with its winner
        return "validity: " + advice_sentence(private=True)
    if metric != "gsd" or not doc:
        return None
    r6, r7 = heldout6(), heldout7()
    if r7:
        earlier = round6_sentence(r6).replace("validity (", "Round 6 (from scratch, no task with a related public set from another source: ", 1) + " " if r6 else ""
        return round7_sentence(r7) + " " + earlier + heldout_sentence(doc, "Earlier") + " " + advice_sentence()
    if r6:
        return round6_sentence(r6) + " " + heldout_sentence(doc, "Earlier") + " " + advice_sentence()
    return heldout_sentence(doc) + " " + advice_sentence()


LABELS = {"gep": "GEP", "second-phase": "the second phase", "second_phase": "the second phase"}


def validated_sentence(doc: dict) -> str | None:
    """Which downstream method the order is validated for (Spearman <= -0.8 on every selection task of
    the benchmark), with the held-out task's figure beside it; None when the figures name none."""
    m = doc.get("validated_for")
    if not m:
        return "The order is validated for no method (Spearman <= -0.8 on every selection task was not reached)." if "validated_for" in doc else None
    rho = doc["spearman"].get(m.replace("-", "_"), {})
    sel = [v for k, v in rho.items() if k.split("@")[0] in doc.get("selection_tasks", [])]
    held = [v for k, v in rho.items() if k.split("@")[0] in doc.get("held_out", [])]
    s = f"The order is validated for {LABELS.get(m, m)} (Spearman {_span(sel)} on the selection tasks"
    return s + (f"; {_span(held)} on the held-out task)." if held else ").")


def advice_sentence(private: bool = False) -> str:
    """What ``gsd train --auto-select`` does with a ranking (the end of ``gsd rank --validity``'s note)."""
    test = ("the private selection chooses it over the in-run noise references and its released energy margin over "
            f"them, beyond the gap between two draws of noise, is above 0 with confidence (alpha {ADVICE.alpha:g})" if private else
            f"it is closer than the in-run noise references with confidence (one-sided paired t-test over "
            f"{ADVICE.rank_repeats} draws, alpha {ADVICE.alpha:g})")
    if private:
        return (f"Advice (gsd train --auto-select --select-epsilon, --method auto): a candidate is used only when {test}; "
                f"the second phase only with one that has the private task's classes and {ADVICE.per_class} examples per class, "
                "else GEP; otherwise DP-SGD without public data. Measured on held-out tasks on the validity page.")
    return (f"Advice (gsd train --auto-select, --method auto): a candidate is used only when {test}, has the private "
            f"task's classes and {ADVICE.per_class} examples per class, and the second phase's stage 1 on it gives the model "
            "better features than it starts with (a linear probe of the private examples against the untrained model's, "
            f"paired t-test over {ADVICE.probe_draws} draws); the second phase with the largest such gain, otherwise DP-SGD without public "
            "data. Measured on held-out tasks on the validity page.")
