"""What a fresh process pays on a GPU before and during its first `gsd rank` (issue 21's < 3 s target).

Two parts, each in its own fresh process:

* ``first-use``: ``import torch``, the CUDA context, then the first call of each library the rank uses
  (cuDNN through a convolution's forward and backward, cuBLAS through a matmul, cuSOLVER through a
  small ``eigh`` and a tall ``qr``), each timed alone and then again (the second call is the kernel's
  own cost; the difference is loading the library and creating its handle);
* ``profile``: the default rank in the process (``gsd_cli.rank(device=...)``), the first call under
  cProfile (internal time, top functions) and a second call timed.

    python benchmarks/bench_gpu_startup.py                # both parts, on cuda
    python benchmarks/bench_gpu_startup.py --part first-use
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_gpu_startup
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import subprocess
import sys
import time

FIRST_USE = r'''
import time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
dev = torch.device(DEVICE)
torch.zeros(1, device=dev); torch.cuda.synchronize()
t2 = time.perf_counter()
print(f"import torch {t1 - t0:.3f} s, CUDA context {t2 - t1:.3f} s")

def twice(name, fn):
    out = []
    for _ in range(2):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize(); out.append(time.perf_counter() - t)
    print(f"{name:<34} first {out[0]:.3f} s, again {out[1]:.4f} s")

x = torch.randn(64, 3, 224, 224, device=dev, requires_grad=True)
conv = torch.nn.Conv2d(3, 16, 5).to(dev)
twice("cuDNN: conv2d forward+backward", lambda: conv(x).sum().backward())
a = torch.randn(2000, 2000, device=dev)
twice("cuBLAS: matmul 2000^2", lambda: a @ a)
s = torch.randn(48, 48, device=dev, dtype=torch.float64); s = s @ s.T
twice("cuSOLVER: eigh 48x48 float64", lambda: torch.linalg.eigh(s))
q = torch.randn(30000, 48, device=dev, dtype=torch.float64)
twice("cuSOLVER: qr 30000x48 float64", lambda: torch.linalg.qr(q))
sc = s.cpu()
twice("CPU: eigh 48x48 float64", lambda: torch.linalg.eigh(sc))
'''

PROFILE = r'''
import cProfile, io, pstats, time
import torch
torch.zeros(1, device=DEVICE); torch.cuda.synchronize()
import gsd_cli
pr = cProfile.Profile()
t = time.perf_counter(); pr.enable(); r = gsd_cli.rank(device=DEVICE); torch.cuda.synchronize(); pr.disable()
first = time.perf_counter() - t
t = time.perf_counter(); gsd_cli.rank(device=DEVICE); torch.cuda.synchronize(); second = time.perf_counter() - t
print(f"first rank {first:.2f} s, second rank {second:.2f} s, engine {r.engine}")
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(22); print(s.getvalue()[-6000:])
s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats("gsd_cli", 25); print(s.getvalue()[-6000:])
'''


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--part", choices=["first-use", "profile", "both"], default="both")
    a = ap.parse_args(argv)
    parts = {"first-use": FIRST_USE, "profile": PROFILE}
    for name, code in parts.items():
        if a.part in (name, "both"):
            print(f"== {name}", flush=True)
            t = time.perf_counter()
            subprocess.run([sys.executable, "-c", code.replace("DEVICE", repr(a.device))], check=True)
            print(f"({name}: {time.perf_counter() - t:.1f} s in all)", flush=True)


if __name__ == "__main__":
    main()
