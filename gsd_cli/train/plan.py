"""A training run's plan, shown before its first step: how many steps, and about how long they take.

The plan is public: the step count comes from a declared size or rate, or from the DP estimate of the
private set's size (:mod:`gsd_cli.train.size`), and the time estimate from one forward and backward
pass of the model on a *synthetic* chunk of public size (random inputs of the model's input shape,
random labels), never on private data. An absurd plan is refused before any step
(:func:`gsd_cli.train.size.check_plan`, ``--max-steps``).

The estimate is a rough one, said as such: a private step costs about a non-private step times the
method's factor (:data:`METHOD_FACTOR`, from ``benchmarks/bench_train_step.py`` on the speed page:
DP-SGD 1.15-1.24x a non-private step, GEP 1.3-1.9x a DP-SGD step), per chunk of ``physical_batch``
examples, and the per-epoch evaluation is not counted.
"""

from __future__ import annotations

import math
import time

import torch

from ..units import duration

#: a private step's cost in non-private steps of the same examples (rounded up from the speed page)
METHOD_FACTOR = {"dpsgd": 1.25, "second-phase": 1.25, "topagg": 1.5, "rgp": 1.5, "gep": 2.4}


def synthetic_step_seconds(model: torch.nn.Module, names: list[str], input_shape: tuple[int, ...], examples: int,
                           device: torch.device) -> float:
    """Seconds of one forward and backward pass of ``examples`` synthetic inputs (the second of two
    passes: the first warms up). Touches no ``.grad``, no global random state, no buffer (BatchNorm
    statistics are put back)."""
    params = dict(model.named_parameters())
    trained = [params[n] for n in names]
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.rand((examples, *input_shape), generator=g).to(device)
    labels = torch.randint(0, 2**31 - 1, (examples,), generator=g)
    took = 0.0
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for _ in range(2):
            t0 = time.perf_counter()
            out = model(x)
            if isinstance(out, (tuple, list)):
                out = out[0]
            out = out.reshape(examples, -1)
            loss = torch.nn.functional.cross_entropy(out, (labels % out.shape[1]).to(device))
            torch.autograd.grad(loss, trained, allow_unused=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            took = time.perf_counter() - t0
    with torch.no_grad():
        for n, b in model.named_buffers():
            b.copy_(buffers[n])
    return took


def estimate_seconds(step_seconds_per_chunk: float, batch_size: int, chunk: int, steps: int, method: str) -> float:
    """About how long ``steps`` private steps take: each of ceil(batch / chunk) chunks at the synthetic
    chunk's time, times the method's factor."""
    chunks = max(1, math.ceil(batch_size / max(1, chunk)))
    return steps * chunks * step_seconds_per_chunk * METHOD_FACTOR.get(method, 1.5)


def plan_line(total_steps: int, epochs: int, steps_per_epoch: int, batch_size: int, q: float, sigma: float,
              epsilon: float, seconds: float | None, lr: str | None = None) -> str:
    """The public plan line printed before the first step; ``lr``: the learning rate and where it came from
    (:func:`gsd_cli.train.tuned.lr_reason`)."""
    s = (f"plan: {total_steps:,} steps ({epochs} epochs x {steps_per_epoch:,}), expected batch {batch_size} "
         f"(q = {q:.4g}), {lr + ', ' if lr else ''}noise multiplier {sigma:.4g}, epsilon {epsilon:.4g}")
    if seconds is not None:
        s += f"; about {duration(seconds)} of steps on this machine (one synthetic chunk timed; evaluation not counted)"
    return s


def announce(model, names, spec, chunk: int, device, cfg, total_steps: int, steps_per_epoch: int, done: int, q: float,
             sigma: float, epsilon: float) -> str:
    """The plan line of a run (``done`` steps already taken, on ``--resume``), its time estimated from one
    synthetic chunk of min(chunk, batch size) examples (no estimate for a model the synthetic pass cannot run)."""
    try:
        per_chunk = synthetic_step_seconds(model, names, (spec.channels, spec.input_size, spec.input_size),
                                           min(chunk, cfg.batch_size), device)
        seconds = estimate_seconds(per_chunk, cfg.batch_size, chunk, total_steps - done, cfg.method)
    except (RuntimeError, TypeError, ValueError):  # its own input contract (a user's model): the plan without a time
        seconds = None
    from .tuned import lr_reason

    return plan_line(total_steps, cfg.epochs, steps_per_epoch, cfg.batch_size, q, sigma, epsilon, seconds,
                     lr=lr_reason(cfg.model, cfg.method, cfg.lr, cfg.batch_size, cfg.weights, cfg.peft))
