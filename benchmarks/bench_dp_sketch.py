"""How much --dp-sketch helps DP-GSD on the embedded default.

For each epsilon and sketch dimension D (none = the full p), over several seeds, runs the DP ranking
and compares it with the non-private ranking of the same seed (and the same sketch): whether the
same-distribution candidate (mnist-b) still wins, Kendall's tau between the two orders, and the
winner's DP distance against the uniform baseline.

    python benchmarks/bench_dp_sketch.py --m 2000 --epsilon 1 4 16 --sketch 0 32 128 512 --seeds 0 1 2
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_dp_sketch
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse

import numpy as np
from scipy.stats import kendalltau

from gsd_cli import rank

from .harness import add_json, write_json


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=2000)
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 4.0, 16.0])
    ap.add_argument("--sketch", type=int, nargs="+", default=[0, 32, 128, 512])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--device", default="auto")
    add_json(ap)
    a = ap.parse_args(argv)
    rows = []
    print(f"{'sketch':>7} {'epsilon':>8} {'mnist-b wins':>13} {'tau vs non-private':>19} {'winner d':>9} {'uniform':>8}")
    for D in a.sketch:
        sk = D or None
        plain = {s: rank(k=a.k, examples=a.m, seed=s, dp_sketch=sk, device=a.device) for s in a.seeds}
        for eps in a.epsilon:
            wins, taus, dwin = [], [], []
            for s in a.seeds:
                r = rank(k=a.k, examples=a.m, seed=s, dp=True, epsilon=eps, dp_sketch=sk, device=a.device)
                order_dp = [x.public for x in r]
                order = [x.public for x in plain[s]]
                wins.append(order_dp[0] == "mnist-b")
                taus.append(kendalltau([order.index(n) for n in order_dp], range(len(order_dp))).statistic)
                dwin.append(r.winner.distance)
                base = r.uniform_baseline
            row = dict(sketch=D, epsilon=eps, wins=float(np.mean(wins)), tau=float(np.mean(taus)), winner_distance=float(np.mean(dwin)), uniform=base)
            rows.append(row)
            print(f"{D or 'none':>7} {eps:>8g} {row['wins']:>13.2f} {row['tau']:>19.2f} {row['winner_distance']:>9.4f} {base:>8.4f}")
    write_json(a.json, {"m": a.m, "k": a.k, "seeds": a.seeds, "rows": rows}, indent=2)


if __name__ == "__main__":
    main()
