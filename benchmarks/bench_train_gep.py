"""Does GSD predict GEP's accuracy? Paper 004's Table 2 on the embedded default.

Private: mnist-a (its fixed train part trains, its test part evaluates). For each embedded public
candidate and each seed: the GSD of the candidate to the private training part, measured with the
model that is trained (fmnist-cnn, as paper 004 Table 2 does: "the same model for private training
and GSD computation"; k=16, m=2000, random labels), then GEP trained with that candidate at one
budget; DP-SGD without public data as the baseline ("-" in the paper). Reports accuracy mean +- sd per
candidate and the rank correlations (Spearman, Kendall) between mean GSD and mean accuracy.

    python benchmarks/bench_train_gep.py                                   # eps=2, 3 seeds
    python benchmarks/bench_train_gep.py --seeds 0 1 --epochs 10 --json benchmarks/results/train_gep.json
    python benchmarks/bench_train_gep.py --summarize a.json b.json          # runs of several files together

Reusing the anchor basis (issue 21): ``--anchor-variants`` trains GEP once per variant, ``N`` for
``--anchor-every N`` (cold power iteration), ``Nw`` for ``--anchor-every N --anchor-warm`` and ``Nw/B``
for those with ``--anchor-batch B`` (B of the public examples drawn per recomputation), with the
same private randomness per seed (``deterministic_noise``), so the variants are compared in pairs:

    python benchmarks/bench_train_gep.py --public mnist-b digits --seeds 0 1 2 3 4 --no-gsd \
        --anchor-variants 1 1w 5 5w 10w --json benchmarks/results/train_gep_anchor_reuse.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_train_gep
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

import torch

from gsd_cli.data import DEFAULT_PUBLIC
from gsd_cli.ranking import rank
from gsd_cli.train import TrainConfig, train
from gsd_cli.train.splits import private_parts

from .harness import add_json, write_json


def summarize(runs: list[dict], publics: list[str]) -> tuple[list[dict], dict]:
    """Accuracy mean +- sd per candidate, and whether GSD's order predicts it: Spearman and Kendall
    between the mean GSD (over seeds) and the mean accuracy, and, for comparison, between each single
    seed's GSD and the mean accuracy (issue 9: do means over repeats predict better than one draw?)."""
    from scipy.stats import kendalltau, spearmanr

    table = []
    for cand in ["-", *publics]:
        rs = [r for r in runs if r["public"] == cand]
        accs = [r["accuracy"] for r in rs]
        gs = [r["gsd"] for r in rs if r["gsd"] is not None]
        table.append({
            "public": cand, "gsd_mean": statistics.mean(gs) if gs else None,
            "gsd_sd": statistics.stdev(gs) if len(gs) > 1 else None,
            "acc_mean": statistics.mean(accs), "acc_sd": statistics.stdev(accs) if len(accs) > 1 else None,
        })
    table.sort(key=lambda r: (r["gsd_mean"] is None, r["gsd_mean"] or 0))
    cands = [r for r in table if r["gsd_mean"] is not None]
    acc = {r["public"]: r["acc_mean"] for r in cands}
    rho = spearmanr([r["gsd_mean"] for r in cands], [r["acc_mean"] for r in cands])
    tau = kendalltau([r["gsd_mean"] for r in cands], [r["acc_mean"] for r in cands])
    single = []
    for seed in sorted({r["seed"] for r in runs}):
        rs = [r for r in runs if r["seed"] == seed and r["gsd"] is not None]
        single.append(spearmanr([r["gsd"] for r in rs], [acc[r["public"]] for r in rs]).statistic)
    print("\n| public | GSD (mean +- sd) | accuracy (mean +- sd) |\n|---|---|---|")
    for r in table:
        g = "-" if r["gsd_mean"] is None else f"{r['gsd_mean']:.3f} +- {r['gsd_sd'] or 0:.3f}"
        print(f"| {r['public']} | {g} | {100 * r['acc_mean']:.2f}% +- {100 * (r['acc_sd'] or 0):.2f} |")
    print(f"\nSpearman(mean GSD, accuracy) = {rho.statistic:.3f} (p={rho.pvalue:.3f}); Kendall tau = {tau.statistic:.3f} (p={tau.pvalue:.3f})")
    print("Spearman(single-seed GSD, accuracy) per seed: " + ", ".join(f"{x:.3f}" for x in single))
    return table, {
        "spearman": {"rho": rho.statistic, "p": rho.pvalue}, "kendall": {"tau": tau.statistic, "p": tau.pvalue},
        "spearman_single_seed": single,
    }


def parse_variant(v: str) -> tuple[int, bool, int | None]:
    """``"5"`` -> (5, False, None), ``"5w"`` -> (5, True, None), ``"2w/500"`` -> (2, True, 500):
    --anchor-every, --anchor-warm and --anchor-batch."""
    head, _, tail = v.partition("/")
    warm = head.endswith("w")
    try:
        every = int(head[:-1] if warm else head)
        batch = int(tail) if tail else None
    except ValueError:
        raise SystemExit(f"--anchor-variants: {v!r} is not N, Nw, N/B or Nw/B (N, B >= 1)") from None
    if every < 1 or (batch is not None and batch < 1):
        raise SystemExit(f"--anchor-variants: {v!r} is not N, Nw, N/B or Nw/B (N, B >= 1)")
    return every, warm, batch


def summarize_variants(runs: list[dict], variants: list[str]) -> list[dict]:
    """Per public set and anchor variant: accuracy mean +- sd over seeds, the paired difference to the
    first variant (same seed, same private randomness) mean +- sd, and the mean run time."""
    table = []
    print("\n| public | variant | accuracy (mean +- sd) | vs " + variants[0] + " (paired, mean +- sd) | residual energy | run time (mean) |"
          "\n|---|---|---|---|---|---|")
    for cand in sorted({r["public"] for r in runs if r["public"] != "-"}):
        base = {r["seed"]: r["accuracy"] for r in runs if r["public"] == cand and r.get("variant", "1") == variants[0]}
        for v in variants:
            rs = [r for r in runs if r["public"] == cand and r.get("variant", "1") == v]
            if not rs:
                continue
            accs = [r["accuracy"] for r in rs]
            diffs = [r["accuracy"] - base[r["seed"]] for r in rs if r["seed"] in base]
            row = {"public": cand, "variant": v, "n": len(rs), "acc_mean": statistics.mean(accs),
                   "acc_sd": statistics.stdev(accs) if len(accs) > 1 else None,
                   "diff_mean": statistics.mean(diffs) if diffs else None,
                   "diff_sd": statistics.stdev(diffs) if len(diffs) > 1 else None,
                   "seconds_mean": statistics.mean(r["seconds"] for r in rs),
                   "residual_energy_mean": statistics.mean(r["residual_energy"] for r in rs) if all(r.get("residual_energy") is not None for r in rs) else None}
            table.append(row)
            d = "-" if row["diff_mean"] is None else f"{100 * row['diff_mean']:+.2f} +- {100 * (row['diff_sd'] or 0):.2f}"
            res = "-" if row["residual_energy_mean"] is None else f"{row['residual_energy_mean']:.3f}"
            print(f"| {cand} | {v} | {100 * row['acc_mean']:.2f}% +- {100 * (row['acc_sd'] or 0):.2f} | {d} | {res} | {row['seconds_mean']:.0f} s |")
    dp = [r["accuracy"] for r in runs if r["public"] == "-"]
    if dp:
        print(f"| none (DP-SGD) | - | {100 * statistics.mean(dp):.2f}% +- {100 * (statistics.stdev(dp) if len(dp) > 1 else 0):.2f} | - | - | - |")
    return table


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--private", default="mnist-a")
    ap.add_argument("--public", nargs="+", default=list(DEFAULT_PUBLIC))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=250)
    ap.add_argument("--k", type=int, default=50)
    ap.add_argument("--public-examples", type=int, default=1000)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--clip-embedding", type=float, default=2.0)
    ap.add_argument("--clip-residual", type=float, default=0.4)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--model", default="fmnist-cnn")
    ap.add_argument("--anchor-variants", nargs="+", default=["1"], metavar="N[w][/B]",
                    help="GEP anchor reuse variants: N = --anchor-every N, Nw = with --anchor-warm, /B = --anchor-batch B (default: 1, the paper's).")
    ap.add_argument("--no-gsd", action="store_true", help="Skip the GSD ranking (for comparing anchor variants only).")
    ap.add_argument("--no-baseline", action="store_true", help="Skip the DP-SGD baseline.")
    add_json(ap)
    ap.add_argument("--summarize", nargs="+", default=None, metavar="JSON",
                    help="Only summarise the runs of earlier --json files (several: their runs together, e.g. more seeds).")
    args = ap.parse_args(argv)
    if args.summarize:
        runs, first = [], None
        for path in args.summarize:
            with open(path) as f:
                doc = json.load(f)
            same = {k: v for k, v in doc["settings"].items() if k not in ("seeds", "json", "summarize")}
            if first is not None and same != first:
                diff = sorted(k for k in same if same[k] != first.get(k))
                raise SystemExit(f"{path}: settings differ from the first file's ({', '.join(diff)}); summarise them apart")
            first = same
            runs += doc["runs"]
        if len(first.get("anchor_variants", ["1"])) > 1 or first.get("no_gsd"):
            summarize_variants(runs, first.get("anchor_variants", ["1"]))
        else:
            summarize(runs, first["public"])
        return
    variants = [(v, *parse_variant(v)) for v in args.anchor_variants]
    t0 = time.time()
    train_part, _ = private_parts(args.private)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            dist = {}
            if not args.no_gsd:
                ranking = rank(train_part, args.public, k=16, examples=2000, seed=seed, model=args.model, device="cpu")
                dist = {r.public: r.distance for r in ranking.results}
                print(f"seed {seed}: GSD " + ", ".join(f"{c} {d:.3f}" for c, d in sorted(dist.items(), key=lambda kv: kv[1])), flush=True)
            jobs = ([] if args.no_baseline else [(None, ("-", 1, False, None))]) + [(c, v) for c in args.public for v in variants]
            for cand, (variant, every, warm, abatch) in jobs:
                cfg = TrainConfig(
                    private=args.private, public=cand, method="gep" if cand else "dpsgd", epsilon=args.epsilon,
                    delta=args.delta, model=args.model, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                    seed=seed, clip=args.clip, k=args.k, public_examples=args.public_examples,
                    clip_embedding=args.clip_embedding, clip_residual=args.clip_residual, deterministic_noise=True,
                    public_distance=dist.get(cand), anchor_every=every, anchor_warm=warm, anchor_batch=abatch,
                )
                run_dir = os.path.join(tmp, f"{seed}-{cand}-{variant}".replace("/", "b"))
                s = train(cfg, run_dir, device="cpu")
                with open(os.path.join(run_dir, "metrics.jsonl")) as f:  # share of the private gradients outside the basis
                    residual = [r["residual_energy"] for r in map(json.loads, f) if "residual_energy" in r]
                runs.append({"seed": seed, "public": cand or "-", "gsd": dist.get(cand), "accuracy": s["test"]["accuracy"],
                             "epsilon": s["epsilon"], "sigma": s["sigma"], "seconds": s["seconds"],
                             **({"variant": variant, "anchor_every": every, "anchor_warm": warm, "anchor_batch": abatch,
                                 "residual_energy": statistics.mean(residual) if residual else None} if cand else {})})
                print(f"  {cand or '- (DP-SGD)':16s} {variant if cand else '':4s} acc {s['test']['accuracy']:.4f}  "
                      f"eps {s['epsilon']:.4f}  {s['seconds']:.0f} s", flush=True)
    if args.no_gsd or len(variants) > 1:
        table, corr = summarize_variants(runs, args.anchor_variants), {}
    else:
        table, corr = summarize(runs, args.public)
    doc = {
        "settings": vars(args), "runs": runs, "table": table,
        **corr,
        "torch": torch.__version__, "threads": torch.get_num_threads(), "platform": platform.platform(), "loadavg": os.getloadavg(),
        "seconds": round(time.time() - t0, 1),
    }
    write_json(args.json, doc, indent=2)


if __name__ == "__main__":
    main()
