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
* the wall-clock time (it grows with N).

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

PUBLISHABLE_NOTE = (
    "publishable: public settings and the privacy statement only; the test metrics, the exact size of the "
    f"private set and other non-DP statistics are in {PRIVATE_SUMMARY}"
)
PRIVATE_NOTE = (
    "NOT publishable: statistics of the private data outside the privacy guarantee (test metrics, the exact "
    "private set size, timing); keep with the run folder"
)


def not_dp_fields(row: dict) -> list[str]:
    """The fields of one ``metrics.jsonl`` row that are not differentially private."""
    return [k for k in row if k in NON_DP_METRICS or k.startswith(NON_DP_METRIC_PREFIXES)]


def split_summary(summary: dict) -> tuple[dict, dict]:
    """``(publishable, private)`` halves of a run's full summary (see the module docstring)."""
    legacy = _legacy_size(summary)
    hidden = NON_DP_SUMMARY_FIELDS + (("sampling_rate",) if legacy else ())
    public = {k: v for k, v in summary.items() if k not in hidden}
    if isinstance(public.get("privacy"), dict) and legacy:
        public["privacy"] = {k: v for k, v in public["privacy"].items() if k not in NON_DP_PRIVACY_FIELDS + ("size",)}
    if isinstance(public.get("selection"), dict) and "seconds" in public["selection"]:  # a non-DP ranking's time grows with N
        public["selection"] = {**public["selection"], "seconds": None}
    public["publishable"] = PUBLISHABLE_NOTE if summary.get("dp") else (
        "public settings only, but the run as a whole is NOT differentially private (see notes)")
    private = {"publishable": False, "note": PRIVATE_NOTE}
    private.update({k: summary[k] for k in NON_DP_SUMMARY_FIELDS if k in summary})
    if legacy:
        private["sampling_rate"] = summary.get("sampling_rate")
        private.update({k: summary["privacy"][k] for k in NON_DP_PRIVACY_FIELDS if k in summary.get("privacy", {})})
    return public, private
