"""What a training run may publish and what it must keep: the split of its outputs.

A run releases one thing with a privacy guarantee: the sequence of noisy updates, hence the trained
weights, at the (epsilon, delta) of its accountant, under add/remove-one-example neighbours. Anything
else computed from the private data is *not* covered by that guarantee:

* the test metrics (accuracy, balanced accuracy, AUC per finding and macro AUC, loss on the private
  test part: exact statistics of private data), and which of them leads (it reflects the test set's
  class balance, :mod:`gsd_cli.train.evaluate`);
* the exact size N of the private set and the sampling rate q = batch_size / N that reveals it;
* per-step statistics of the private gradients: the fraction clipped, GEP's residual energy,
  TopAgg's kept fraction, the realised (Poisson) batch sizes;
* the wall-clock time (it grows with N).

``summary.json`` holds only what may be published: public settings and the privacy statement
(epsilon, delta, noise multiplier, steps, expected batch size, accountant and relation). The number of
steps is epochs x round(N / batch_size), so, as in every DP-SGD accountant (Opacus, TF Privacy), the
*rough* size of the private set is treated as public; the exact N is not in it. The rest goes to
``private-summary.json`` (marked ``"publishable": false``), beside the checkpoint, which is private
too (it holds the secret seed of the sampling and noise). ``metrics.jsonl`` is private and each row
lists its fields that are not DP under ``"not_dp"``.
"""

from __future__ import annotations

#: Top-level fields of the full summary that are not differentially private.
NON_DP_SUMMARY_FIELDS = ("private_train_examples", "private_test_examples", "sampling_rate", "test", "seconds")
#: Fields of the ``privacy`` block that reveal the exact private set size.
NON_DP_PRIVACY_FIELDS = ("sampling_rate",)
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
    public = {k: v for k, v in summary.items() if k not in NON_DP_SUMMARY_FIELDS}
    if isinstance(public.get("privacy"), dict):
        public["privacy"] = {k: v for k, v in public["privacy"].items() if k not in NON_DP_PRIVACY_FIELDS}
    public["publishable"] = PUBLISHABLE_NOTE if summary.get("dp") else (
        "public settings only, but the run as a whole is NOT differentially private (see notes)")
    private = {"publishable": False, "note": PRIVATE_NOTE}
    private.update({k: summary[k] for k in NON_DP_SUMMARY_FIELDS if k in summary})
    private.update({k: summary["privacy"][k] for k in NON_DP_PRIVACY_FIELDS if k in summary.get("privacy", {})})
    return public, private
