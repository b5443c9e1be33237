"""The two Conv2d rules of the ``layers`` engine, per layer shape: patches (one batched matmul of the
output gradient with the input's channels-last patches) against torch's grouped weight-gradient kernel
(a convolution with n groups), on channels-first and channels-last inputs. The evidence for
``GROUPED_MIN_CHANNELS`` in :mod:`gsd_cli.gradients.layers`.

Shapes: the convolutions of the probe (224x224), the FMNIST CNN (28x28) and ResNet20 (32x32).

    python benchmarks/bench_layer_rules.py --json benchmarks/results/cpu_layer_rules.json
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: as python -m benchmarks.bench_layer_rules
    import _rerun  # noqa: F401 (benchmarks/_rerun.py; never returns)

import argparse
import platform
import statistics
import time

import torch
import torch.nn as nn

from gsd_cli.allocator import keep_freed_memory
from gsd_cli.gradients.layers import conv2d_grouped, conv2d_patches

from .harness import add_json, write_json

#: name, in channels, out channels, kernel, stride, padding, input size
SHAPES = [
    ("probe conv1", 3, 64, 8, 5, 0, 224), ("probe conv2", 64, 16, 4, 3, 0, 22),
    ("fmnist-cnn conv1", 1, 16, 8, 2, 3, 28), ("fmnist-cnn conv2", 16, 32, 4, 2, 0, 13),
    ("resnet20 16ch", 16, 16, 3, 1, 1, 32), ("resnet20 32ch", 32, 32, 3, 1, 1, 16),
    ("resnet20 64ch", 64, 64, 3, 1, 1, 8), ("resnet20 16->32 stride 2", 16, 32, 3, 2, 1, 32),
]


def _median_ms(fn, repeats: int) -> float:
    fn()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1000 * statistics.median(ts)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=64, help="examples per chunk (the CPU default)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=None)
    add_json(ap)
    a = ap.parse_args(argv)
    keep_freed_memory()
    if a.threads:
        torch.set_num_threads(a.threads)
    rows = []
    for name, cin, cout, k, s, p, size in SHAPES:
        layer = nn.Conv2d(cin, cout, k, stride=s, padding=p, bias=False)
        x = torch.randn(a.n, cin, size, size)
        for fmt, label in ((torch.contiguous_format, "channels-first"), (torch.channels_last, "channels-last")):
            xx = x.contiguous(memory_format=fmt)
            with torch.no_grad():
                g = torch.randn_like(layer(xx))
            with torch.no_grad():
                ms = {rule.__name__: _median_ms(lambda: rule(layer, xx, g)[layer.weight].contiguous(), a.repeats)
                      for rule in (conv2d_patches, conv2d_grouped)}
            rows.append({"layer": name, "in_channels": cin, "layout": label, "patches_ms": ms["conv2d_patches"],
                         "grouped_ms": ms["conv2d_grouped"]})
            print(f"{name:<26} {label:<15} patches {ms['conv2d_patches']:7.2f} ms  grouped {ms['conv2d_grouped']:7.2f} ms")
    write_json(a.json, {"n": a.n, "threads": torch.get_num_threads(), "torch": torch.__version__,
                        "machine": platform.machine(), "rows": rows}, indent=1)


if __name__ == "__main__":
    main()
