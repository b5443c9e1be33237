"""What k runs on one data set cost the privacy ledger (`gsd budget`): basic composition against the
Rényi filter, and the same curves composed as if the runs were fixed in advance.

Each run is DP-SGD calibrated to (--epsilon, --delta) at Poisson rate --q for --steps steps
(dp-accounting's RDP accountant, as gsd train); k of them are booked in a fresh ledger with a budget of
delta --delta, and `BudgetLedger.status` gives the figures `gsd budget show` prints. No data, no
training: accounting only (seconds).

    python benchmarks/bench_budget_composition.py
    python benchmarks/bench_budget_composition.py --q 0.004 --steps 5000 --runs 10
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_budget_composition
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import tempfile
from pathlib import Path

from gsd_cli.privacy import calibrate_noise, dpsgd_step_event, epsilon_of, training_event
from gsd_cli.privacy import budget as B


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--q", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args(argv)
    z = calibrate_noise(dpsgd_step_event, a.epsilon, a.delta, a.q, a.steps, cache=False)
    event = training_event(dpsgd_step_event(z), a.q, a.steps)
    eps = epsilon_of(event, a.delta)
    data = B.DataIdentity("0" * 64, "bench", "arrays")
    with tempfile.TemporaryDirectory() as tmp:
        led = B.BudgetLedger(Path(tmp) / "ledger.sqlite")
        led.set_budget(data, 1e9, a.delta)
        print(f"DP-SGD runs of epsilon {eps:.4f} at delta {a.delta:g} (q={a.q:g}, {a.steps} steps, sigma={z:.4f}); "
              f"budget delta {a.delta:g}, {len(B.ORDERS)} RDP orders")
        print(f"{'runs':>4} {'basic':>8} {'Rényi filter':>13} {'fixed in advance':>17}")
        for k in range(1, a.runs + 1):
            B.book_training(data, event, epsilon=eps, delta=a.delta, method="dpsgd", mechanism="DP-SGD", ledger_location=led.location)
            s = led.status()[0]["spent"]
            print(f"{k:>4} {s['basic_epsilon']:>8.3f} {s['renyi_epsilon']:>13.3f} {s['renyi_epsilon_fixed']:>17.3f}")


if __name__ == "__main__":
    main()
