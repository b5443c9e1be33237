"""What a training run may publish and what it must keep: the split of its outputs.

A run releases one thing with a privacy guarantee: the sequence of noisy updates, hence the trained
weights, at the (epsilon, delta) of its accountant, under add/remove-one-example neighbours. Anything
else computed from the private data is *not* covered by that guarantee:

* the test metrics (accuracy, balanced accuracy, AUC per finding and macro AUC, loss on the private
  test part: exact statistics of private data), and which of them leads (it reflects the test set's
  class balance, :mod:`gsd_cli.train.evaluate`);
* the exact size N of the private set (and how many private examples were left out because the
  public data holds them);
* per-step statistics of the private gradients: the fraction clipped, GEP's residual energy,
  TopAgg's kept fraction, the realised (Poisson) batch sizes;
* the wall-clock time (it grows with N);
* a non-private selection's figures (``gsd train --auto-select`` without ``--select-epsilon``): its
  distances and their order, the noise references' rows, the feature probe's accuracies and gains,
  the p-values, the number of private examples the ranking drew (:func:`public_selection`). Which
  public set and method it chose stay in ``summary.json``, which then says that the run is not DP.

On the console the same split holds (``gsd train``): a line that carries any of these starts with
``private:`` (the test result, the private notes, the progress lines with their times); every other
line is a function of public inputs and the DP releases (:class:`PrivateNote`, :func:`delta_notes`).

``summary.json`` holds only what may be published: public settings and the privacy statement
(epsilon, delta, noise multiplier, sampling rate, steps, expected batch size, accountant and
relation). The sampling rate and the number of steps come from a declared size or rate, or from a
DP estimate of N booked in the same epsilon (:mod:`gsd_cli.train.size`), never from N itself, so
none of them reveals N (a run resumed from gsd 0.1, whose q was batch_size / N, keeps its q in the
private file). The rest goes to
``private-summary.json`` (marked ``"publishable": false``), beside the checkpoint, which is private
too (it holds the secret seed of the sampling and noise). ``metrics.jsonl`` is private and each row
lists its fields that are not DP under ``"not_dp"``.
"""

from __future__ import annotations

#: Top-level fields of the full summary that are not differentially private.
NON_DP_SUMMARY_FIELDS = ("private_train_examples", "private_test_examples", "test", "seconds")
#: Fields of the ``privacy`` block that reveal the exact private set size (only in a run started by gsd 0.1, q = B / N).
NON_DP_PRIVACY_FIELDS = ("sampling_rate",)


def _legacy_size(summary: dict) -> bool:
    """A run resumed from gsd 0.1, whose sampling rate is batch_size / N (it reveals N)."""
    size = (summary.get("privacy") or {}).get("size") or {}
    return str(size.get("how", "")).startswith("exact-size")
#: Fields of a ``metrics.jsonl`` row that are not DP (and prefixes of such fields).
NON_DP_METRICS = ("test_loss", "test_accuracy", "test_macro_auc", "mean_batch", "residual_energy", "topk_fraction_kept")
NON_DP_METRIC_PREFIXES = ("fraction_clipped_", "test_")  # every test metric (balanced accuracy, AUC per finding...)

PRIVATE_SUMMARY = "private-summary.json"
#: What starts a console line that carries private figures (the CLI's ``gsd_cli.cli.common.PRIVATE_LABEL``)
PRIVATE_LABEL = "private:"

PUBLISHABLE_NOTE = (
    "publishable: public settings and the privacy statement only; the test metrics, the exact size of the "
    f"private set and other non-DP statistics are in {PRIVATE_SUMMARY}"
)
PRIVATE_NOTE = (
    "NOT publishable: statistics of the private data outside the privacy guarantee (test metrics, the exact "
    "private set size, timing); keep with the run folder"
)


#: What ``summary.json`` keeps of a non-private selection (:func:`public_selection`): settings, all public
SELECTION_PUBLIC_FIELDS = ("metric", "model", "k", "examples", "seed", "labels", "row_norm", "params", "num_params", "sketch",
                           "weights", "peft", "dp", "privacy", "subspace_method", "repeats", "repeat_seeds", "level", "tie_test",
                           "dp_repeats")
#: ... and of its advice: the decision (what it trains with), not the figures that led to it
ADVICE_PUBLIC_FIELDS = ("method", "public", "fell_back", "refused")
SELECTION_NOTE = (
    f"a non-private selection: its distances and their order, the noise references' rows, the feature probe's accuracies "
    f"and gains, the p-values and the number of private examples it drew are statistics of the private data, in {PRIVATE_SUMMARY}"
)
NON_PRIVATE_SELECTION_NOTE = (
    "public settings only: the public set and the method were chosen by a non-private selection of the private data, so the "
    f"run as a whole is NOT differentially private (see notes); the selection's statistics of the private data are in {PRIVATE_SUMMARY}"
)


class PrivateNote(str):
    """A note of a training run that names a private fact (the exact size N, how many private examples
    the public data holds, files of the private set that are missing): it goes to
    ``private-summary.json`` and, through ``notify``, to a line that says it is private; never to
    ``summary.json`` or a public line. A plain ``str`` given to ``notify`` is public."""


def delta_notes(delta: float, size, batch_size: int) -> list[str]:
    """The public warning that ``--delta`` is not well below 1/N, for the size N that sets the
    mechanism (``size``: a :class:`~gsd_cli.train.size.MechanismSize`): the declared ``--expected-size``,
    the DP estimate N~ (released with the run), or batch size / q for a declared ``--sampling-rate``.
    Never the exact N: whether a line appears, and what it says, would then be a function of the
    private set outside any mechanism (the exact-N note is a :class:`PrivateNote`)."""
    if size.size is not None:
        n = int(size.size)
        what = {"declared-size": "the declared --expected-size",
                "dp-estimate": "the DP estimate of the private set's size"}.get(size.how, "the size that sets the mechanism")
    elif size.q > 0:
        n = batch_size / size.q
        what = "the size --sampling-rate stands for (batch size / q)"
    else:
        return []
    if delta < 1 / n:
        return []
    shown = f"{n:.6g}" if isinstance(n, float) else str(n)
    return [f"--delta {delta:g} is at or above 1/N = {1 / n:.3g} for N = {shown}, {what}: delta should be well below 1/N"]


def composition(selection_epsilon: float, size_epsilon: float, training_epsilon: float, selected: bool = False) -> dict:
    """The ``privacy`` block's ``composition`` (and ``epsilon_selection``, with a DP selection): every
    mechanism of the run on the private set with the epsilon it was accounted at, as the ledger holds
    them: the DP selection of the public data (``gsd train --auto-select --select-epsilon``), the DP
    estimate of N, the training. The parts it names add to the total it states (the ``budget``'s
    ``total_epsilon``). ``selected``: the public data was chosen by a selection at all (with
    ``selection_epsilon`` 0: a non-private one, outside any guarantee)."""
    parts = [(what, float(e)) for what, e in (("the public-data selection", selection_epsilon), ("the size estimate", size_epsilon))
             if e] + [("the training", float(training_epsilon))]
    if len(parts) == 1:
        text = "one mechanism (the training)"
    else:
        text = "basic: " + " + ".join(f"{what}'s epsilon {e:.6g}" for what, e in parts) + f" = {sum(e for _, e in parts):.6g}"
    if selection_epsilon:  # the block's own 'epsilon' leaves the selection out (it is booked on its own line)
        own = "the size estimate's and the training's" if size_epsilon else "the training's"
        text += f"; 'epsilon' is {own}, the selection's is booked beside it in 'budget'"
    if selected and not selection_epsilon:
        text += "; the public data was chosen by a non-private selection, outside any guarantee (NOT DP end to end)"
    return {"composition": text, **({"epsilon_selection": float(selection_epsilon)} if selection_epsilon else {})}


def not_dp_fields(row: dict) -> list[str]:
    """The fields of one ``metrics.jsonl`` row that are not differentially private."""
    return [k for k in row if k in NON_DP_METRICS or k.startswith(NON_DP_METRIC_PREFIXES)]


def non_private_selection(summary: dict) -> bool:
    """Whether the run's public data was chosen by a selection that is no DP release (``gsd train
    --auto-select`` without ``--select-epsilon``): its figures are statistics of the private data."""
    sel = summary.get("selection")
    return isinstance(sel, dict) and not sel.get("privacy") and sel.get("reads_private", True)


def public_selection(selection: dict) -> dict:
    """What ``summary.json`` keeps of a non-private selection: its public settings (model, k, m requested,
    seed, labels, repeats...), the candidates (names, sorted: not the order found), and the decision it
    led to (method, public set); the rest (distances, their order, the references' rows, the probe's
    accuracies and gains, p-values, the private examples drawn, the time) goes to ``private-summary.json``."""
    public = {k: selection[k] for k in SELECTION_PUBLIC_FIELDS if k in selection}
    names = [r.get("public") for r in selection.get("results") or () if isinstance(r, dict)] + list(selection.get("not_selected") or ()) + list(
        selection.get("not_ranked") or ()) + list(selection.get("stopped") or ())  # which were ranked is the probe's verdict: only the sorted names stay
    public["candidates"] = sorted(n for n in names if n is not None)
    advice = selection.get("advice")
    if isinstance(advice, dict):
        public["advice"] = {k: advice[k] for k in ADVICE_PUBLIC_FIELDS if k in advice}
    public["statistics"] = SELECTION_NOTE
    return public


def split_summary(summary: dict) -> tuple[dict, dict]:
    """``(publishable, private)`` halves of a run's full summary (see the module docstring)."""
    legacy = _legacy_size(summary)
    hidden = NON_DP_SUMMARY_FIELDS + (("sampling_rate",) if legacy else ())
    public = {k: v for k, v in summary.items() if k not in hidden}
    if isinstance(public.get("privacy"), dict) and legacy:
        public["privacy"] = {k: v for k, v in public["privacy"].items() if k not in NON_DP_PRIVACY_FIELDS + ("size",)}
    if isinstance(public.get("selection"), dict) and "seconds" in public["selection"]:  # a non-DP ranking's time grows with N
        public["selection"] = {**public["selection"], "seconds": None}
    chosen_privately = non_private_selection(summary)
    if chosen_privately:  # its statistics of the private data: to the private file, the settings and the choice stay
        public["selection"] = public_selection(summary["selection"])
        public["public_distance"] = None
        if isinstance(public.get("settings"), dict):
            public["settings"] = {**public["settings"], "public_distance": None}
    if summary.get("dp"):
        public["publishable"] = PUBLISHABLE_NOTE
    elif chosen_privately:
        public["publishable"] = NON_PRIVATE_SELECTION_NOTE
    else:
        public["publishable"] = "public settings only, but the run as a whole is NOT differentially private (see notes)"
    private = {"publishable": False, "note": PRIVATE_NOTE + (
        "; and the non-private selection's statistics of the private data ('selection', 'public_distance')" if chosen_privately else "")}
    private.update({k: summary[k] for k in NON_DP_SUMMARY_FIELDS if k in summary})
    if chosen_privately:
        private["selection"] = summary["selection"]
        private["public_distance"] = summary.get("public_distance")
    if legacy:
        private["sampling_rate"] = summary.get("sampling_rate")
        private.update({k: summary["privacy"][k] for k in NON_DP_PRIVACY_FIELDS if k in summary.get("privacy", {})})
    return public, private
