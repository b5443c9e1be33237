"""Privacy accounting: mechanisms as declarative dp-accounting events, accountants, a budget ledger.

Kept apart from the trainers (as Opacus keeps accountants apart from its optimizers): a trainer
declares what it releases per step (:func:`gep_step_event`, :func:`dpsgd_step_event`), this package
says what that costs (:func:`epsilon_of`) and which noise multiplier meets a target
(:func:`calibrate_noise`).
"""

# Loaded on first use (PEP 562): importing dp-accounting pulls in scipy (about 2 s), which a non-DP
# ``gsd rank`` that only needs :mod:`.randomness` should not pay.
_ACCOUNTANT_NAMES = (
    "ACCOUNTANTS", "check_delta", "check_epsilon", "Charge", "Ledger", "calibrate_noise", "dpsgd_step_event",
    "effective_noise_multiplier", "epsilon_of", "gep_step_event", "training_event", "confirm_epsilon", "confirmed_epsilon",
    "never_sampled_delta", "second_epsilon",
)


def __getattr__(name: str):
    if name in _ACCOUNTANT_NAMES:
        from . import accountant

        return getattr(accountant, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ACCOUNTANTS", "Charge", "Ledger", "check_delta", "check_epsilon", "calibrate_noise", "dpsgd_step_event", "effective_noise_multiplier", "epsilon_of",
    "gep_step_event", "training_event", "confirm_epsilon", "confirmed_epsilon", "never_sampled_delta", "second_epsilon",
]
