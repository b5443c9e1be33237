"""GSD at scale: time and peak memory of the materialised path, the Gram/ghost path and the authors' pipeline.

For each model and m (examples per dataset; two datasets, mnist-a and mnist-b, random labels, k=16,
unit rows) each step runs in its own subprocess, so its peak resident set (``ru_maxrss``) is its own:

* floor       : one plain batched forward+backward over the same 2 x m examples;
* ghost       : ``--gram ghost``: m x m Gram matrices, V = G^T U / s by one more pass (gsd_cli.ghost);
* materialize : per-sample gradient matrix (m x p) + eigh of its float64 Gram (gsd's ``--gram materialize``);
* authors     : Opacus GradSampleModule, rows stacked, full torch.linalg.svd (bench_rank.authors_path).

A step whose m x p matrix (materialize: 4 m p bytes; authors: 12 m p bytes, G plus the SVD's copies)
exceeds ``--max-gb`` is not run; the JSON says how much it would need. Load average is recorded.

    python benchmarks/bench_scale.py --models resnet50 --m 2000 --steps ghost --json benchmarks/results/cpu_scale_resnet50.json
    python benchmarks/bench_scale.py                      # probe, resnet20, resnet50 x m in {500, 2000}, all steps
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_scale
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import json
import os
import platform
import resource
import subprocess
import time

from .harness import add_json, child_env, module_command, write_json

STEPS = ("floor", "ghost", "materialize", "authors")


def _one(model_name: str, m: int, step: str, k: int, budget: str) -> dict:
    import logging
    import warnings

    import torch

    from .bench_rank import authors_path, chunks, floor, gsd_path

    from gsd_cli.data import draw
    from gsd_cli.ghost import ghost_subspace
    from gsd_cli.gradients import select_parameters
    from gsd_cli.subspace import projection_metric
    from probes import get_model_spec

    logging.getLogger("opacus").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    spec = get_model_spec(model_name)
    model = spec.build(num_classes=10, seed=0)
    xs, ys = [], []
    for ds in ("mnist-a", "mnist-b"):
        smp = draw(ds, m, 0)
        xs.append(smp.tensor(spec.input_size, spec.channels))
        ys.append(torch.randint(0, 10, (len(smp),), generator=torch.Generator().manual_seed(1)))
    dev = torch.device("cpu")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out: dict = {}
    t0 = time.perf_counter()
    if step == "floor":
        floor(model, xs, ys, 64, dev)
    elif step == "materialize":
        out["distance"] = gsd_path(model, xs, ys, 64, dev, k, "auto")
    elif step == "authors":
        out["distance"] = authors_path(model, xs, ys, 64, dev, k)
    elif step == "ghost":
        names = select_parameters(model)
        bases, infos = [], []
        for x, y in zip(xs, ys):
            info: dict = {}
            V, _ = ghost_subspace(
                model, (lambda c, x=x, y=y: chunks(x, y, c)), x.shape[0], names, k, row_norm="unit",
                memory_budget=budget, info=info,
            )
            bases.append(V)
            infos.append(info)
        out["distance"] = projection_metric(*bases)
        out["ghost_info"] = infos
    out["seconds"] = time.perf_counter() - t0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["rss_before_mb"] = base / 2**20
    out["params"] = sum(p.numel() for p in model.parameters())
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="probe,resnet20,resnet50")
    ap.add_argument("--m", default="500,2000")
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--memory-budget", default="4G")
    ap.add_argument("--max-gb", type=float, default=12.0, help="skip materialize/authors when their m x p matrices need more")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per step")
    add_json(ap)
    ap.add_argument("--one", nargs=3, metavar=("MODEL", "M", "STEP"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print("RESULT " + json.dumps(_one(a.one[0], int(a.one[1]), a.one[2], a.k, a.memory_budget)))
        return
    from probes import get_model_spec

    import torch

    report = {
        "device": f"cpu ({os.cpu_count()} cores, {platform.processor() or platform.machine()})",
        "torch": torch.__version__, "threads": torch.get_num_threads(), "k": a.k, "memory_budget": a.memory_budget,
        "loadavg_start": os.getloadavg(), "runs": [],
    }
    if a.json and os.path.exists(a.json):
        with open(a.json) as f:
            report["runs"] = json.load(f).get("runs", [])
    for name in a.models.split(","):
        spec = get_model_spec(name)
        p = sum(q.numel() for q in spec.build(num_classes=10, seed=0).parameters())
        for m in [int(v) for v in a.m.split(",")]:
            for step in a.steps.split(","):
                row = {"model": name, "m": m, "step": step, "params": p, "input": spec.input_size,
                       "loadavg_before": os.getloadavg()}
                need = {"materialize": 4 * m * p, "authors": 12 * m * p}.get(step, 0) / 2**30
                if need > a.max_gb:
                    row["skipped"] = f"needs ~{need:.1f} GiB for the m x p matrices (limit --max-gb {a.max_gb})"
                else:
                    try:
                        r = subprocess.run(
                            module_command(__spec__.name, "--one", name, str(m), step, "--k", str(a.k),
                                           "--memory-budget", a.memory_budget),
                            capture_output=True, text=True, timeout=a.timeout, env=child_env(),
                        )
                        res = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
                        if res:
                            row.update(json.loads(res[-1][7:]))
                        else:
                            row["error"] = (r.stderr or r.stdout)[-800:]
                    except subprocess.TimeoutExpired:
                        row["skipped"] = f"ran past --timeout {a.timeout:.0f} s"
                row["loadavg_after"] = os.getloadavg()
                report["runs"] = [x for x in report["runs"] if (x["model"], x["m"], x["step"]) != (name, m, step)] + [row]
                show = {k: v for k, v in row.items() if k != "ghost_info"}
                print(json.dumps(show), flush=True)
                if a.json:
                    _ratios(report)
                    write_json(a.json, report, indent=2, loadavg_before=report["loadavg_start"])


def _ratios(report: dict) -> None:
    by = {(r["model"], r["m"], r["step"]): r for r in report["runs"]}
    for r in report["runs"]:
        fl = by.get((r["model"], r["m"], "floor"))
        if "seconds" in r and fl and "seconds" in fl:
            r["x_floor"] = r["seconds"] / fl["seconds"]
        gh = by.get((r["model"], r["m"], "ghost"))
        if "seconds" in r and gh and "seconds" in gh:
            r["x_ghost"] = r["seconds"] / gh["seconds"]
            r["mem_x_ghost"] = r["peak_rss_mb"] / gh["peak_rss_mb"]


if __name__ == "__main__":
    main()
