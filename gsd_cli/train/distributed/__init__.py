"""Private training across processes and machines (torch.distributed): the :class:`World` of a run.

One run, several processes (``gsd train --nproc N``, :func:`gsd_cli.train.train` with ``nproc=N``, or
``torchrun --nproc-per-node N -m gsd_cli.cli train ...``; gloo on CPU, NCCL on GPUs). The mechanism
and its accounting are exactly those of one process:

* **Sampling.** Every process draws the whole n-length Poisson inclusion mask of step t from the
  step's secret generator (:func:`gsd_cli.train.step.private_randomness`) and keeps the included
  indices of its own shard, the fixed partition ``i mod size == rank`` of the private training set.
  The union of the shards' subsamples is the one-process subsample, for any number of processes: one
  Poisson sample with rate q. The secret seed is drawn from the operating system by process 0 and
  broadcast (:meth:`World.share_seed`); it is never printed, and written only to process 0's
  (private) checkpoint.
* **Clipping and summing.** Each process computes, clips (and projects, for GEP) the per-sample
  gradients of its shard and sums them in float64; the sums are all-reduced (SUM, float64,
  :meth:`World.all_reduce_sums`) and cast back to float32.
* **Noise.** Process 0 alone runs the chain's aggregated transforms (the Gaussian noise, from the
  step's secret generator: added once per step) and broadcasts the released update; every process
  applies the same update, so all hold the same weights.
* **GEP's anchors.** Each process computes the per-sample gradients of its block of the public
  anchors; the rows are exchanged exactly (all-gather, no arithmetic), every process runs the power
  iteration on the same matrix, and process 0's bases are broadcast each time they are recomputed
  (:class:`BroadcastAnchor`), so all processes embed with the same bases.
* **Outputs.** Process 0 alone evaluates, writes metrics, checkpoints and summaries; the others write
  nothing. A checkpoint does not depend on the number of processes: ``--resume`` works with the same
  or another number.

Equality with one process: the same examples, clips and noise; only the order of the float64
additions differs (and, for chunks of other sizes, possibly the last bits of a per-sample gradient),
so the weights agree with the one-process run to float rounding (tested to 1e-6 relative), and are
often bit for bit equal.
"""

from __future__ import annotations

import datetime
import math
import os
from typing import Sequence

import numpy as np
import torch

from ...errors import GSDError, PrivateError
from ..gep import GEPProject
from ..transforms import StepContext, Transform

#: how long a process waits for the others at a collective (process 0 evaluates and checkpoints
#: while the others wait; the second phase's stage 1 runs on process 0 alone)
TIMEOUT = datetime.timedelta(hours=24)
#: the per-example counters of ``ctx.info`` that are summed across processes at the end of an epoch
SHARD_COUNTERS = ("residual_ratio", "topk_kept")


class World:
    """The processes of one run: this one's ``rank`` among ``size``, the ``device`` it computes on,
    and ``comm``, the device its collectives run on (CPU for gloo, the GPU for NCCL). ``World()``:
    one process, every method a no-op."""

    def __init__(self, rank: int = 0, size: int = 1, device: torch.device | None = None, comm: torch.device | None = None):
        self.rank, self.size = int(rank), int(size)
        self.device = device
        self.comm = comm or torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Process 0: the one that adds the noise, evaluates and writes."""
        return self.rank == 0

    def __repr__(self) -> str:
        return f"World(rank={self.rank}, size={self.size}, device={self.device}, comm={self.comm})"

    # -- collectives --------------------------------------------------------------------------------
    def _dist(self):
        import torch.distributed as dist

        return dist

    def barrier(self) -> None:
        if self.size > 1:
            self._dist().barrier()

    def broadcast_(self, t: torch.Tensor, src: int = 0) -> torch.Tensor:
        """``t`` replaced in place by process ``src``'s."""
        if self.size > 1:
            buf = t.detach().to(self.comm).contiguous()
            self._dist().broadcast(buf, src)
            with torch.no_grad():
                t.copy_(buf.to(t.device))
        return t

    def broadcast_vector(self, v: torch.Tensor | None, length: int, dtype: torch.dtype, device) -> torch.Tensor:
        """Process 0's ``v`` (``length`` values) on every process, as ``dtype`` on ``device`` (sent
        in float64, so a float32 vector arrives unchanged)."""
        buf = v.to(self.comm, torch.float64) if self.is_main else torch.empty(length, dtype=torch.float64, device=self.comm)
        if self.size > 1:
            self._dist().broadcast(buf, 0)
        return buf.to(device, dtype)

    def all_reduce_sums(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each part summed across processes, in float64 (one collective for all parts)."""
        if self.size == 1:
            return sums
        keys = sorted(sums)
        flat = torch.cat([sums[k].reshape(-1).to(self.comm, torch.float64) for k in keys])
        self._dist().all_reduce(flat)
        out, col = {}, 0
        for k in keys:
            n = sums[k].numel()
            out[k] = flat[col : col + n].view_as(sums[k]).to(sums[k].device)
            col += n
        return out

    def all_gather_rows(self, rows: torch.Tensor, total: int) -> torch.Tensor:
        """The row blocks of all processes (block r from process r, ``ceil(total / size)`` rows each,
        the last ones shorter or empty), stacked in rank order: the ``total`` x p matrix, exactly."""
        if self.size == 1:
            return rows
        per = math.ceil(total / self.size)
        pad = torch.zeros(per, rows.shape[1], dtype=rows.dtype, device=self.comm)
        pad[: rows.shape[0]] = rows.to(self.comm)
        blocks = [torch.empty_like(pad) for _ in range(self.size)]
        self._dist().all_gather(blocks, pad)
        return torch.cat(blocks)[:total].to(rows.device)

    def share_seed(self, seed: int) -> int:
        """Process 0's 128-bit secret seed, on every process (never printed or written here)."""
        if self.size == 1:
            return int(seed)
        words = torch.tensor([(int(seed) >> (32 * i)) & 0xFFFFFFFF for i in range(4)], dtype=torch.int64, device=self.comm)
        self._dist().broadcast(words, 0)
        return sum(int(w) << (32 * i) for i, w in enumerate(words.tolist()))

    def broadcast_module(self, model: torch.nn.Module) -> None:
        """Process 0's parameters and buffers in every process's ``model``."""
        if self.size > 1:
            for t in [*model.parameters(), *model.buffers()]:
                self.broadcast_(t.data)

    def reduce_info(self, info: dict) -> None:
        """Sum the per-example counters of ``info`` (fraction clipped, GEP's residual energy,
        TopAgg's kept fraction: each process counted its shard) across processes, in place."""
        if self.size == 1:
            return
        mine = {k: list(v) for k, v in info.items() if (k.startswith("clipped_") or k in SHARD_COUNTERS) and isinstance(v, list)}
        every: list = [None] * self.size
        self._dist().all_gather_object(every, mine)
        for k in sorted({k for d in every for k in d}):
            vals = [d[k] for d in every if k in d]
            info[k] = [sum(v[i] for v in vals) for i in range(len(vals[0]))]

    def from_main(self, fn):
        """``fn()`` run by process 0 alone (reading the run folder, which the others may not see on
        other machines) and its (picklable) result on every process; a :class:`GSDError` there is
        raised on every process."""
        if self.size == 1:
            return fn()
        box: list = [None]
        if self.is_main:
            try:
                box[0] = ("ok", fn())
            except GSDError as e:  # a PrivateError stays one (its line is labelled private)
                box[0] = ("private-error" if isinstance(e, PrivateError) else "error", str(e))
        self._dist().broadcast_object_list(box, 0)
        kind, value = box[0]
        if kind in ("error", "private-error"):
            raise (PrivateError if kind == "private-error" else GSDError)(value)
        return value

    def load_state(self, path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """:func:`gsd_cli.train.checkpoint.load_state` on process 0, its weights and momentum
        buffers broadcast to the others."""
        from ..checkpoint import load_state

        if self.is_main:
            load_state(path, model, optimizer)
        if self.size == 1:
            return
        self.broadcast_module(model)
        params = dict(model.named_parameters())
        names = {id(p): n for n, p in params.items()}
        held = self.from_main(lambda: sorted(names[id(p)] for p, st in optimizer.state.items() if st.get("momentum_buffer") is not None))
        for n in held:
            state = optimizer.state[params[n]]
            state["momentum_buffer"] = self.broadcast_(state["momentum_buffer"] if self.is_main else torch.zeros_like(params[n]))

    # -- the pieces of a step -----------------------------------------------------------------------
    def shard(self, idx: np.ndarray) -> np.ndarray:
        """This process's part of a subsample: the indices i with ``i mod size == rank``."""
        return idx if self.size == 1 else idx[idx % self.size == self.rank]

    def distribute(self, method, anchor=None) -> None:
        """Make ``method`` (and GEP's ``anchor``) work across the processes: the anchor gradients
        computed on a block of the anchors per process (:class:`ShardedRows`), the bases broadcast
        from process 0 (:class:`BroadcastAnchor`, right after the projection's ``begin_step``)."""
        if self.size == 1 or anchor is None:
            return
        anchor.gradients = ShardedRows(anchor.gradients, self)
        ts = method.chain.transforms
        at = next((i for i, t in enumerate(ts) if isinstance(t, GEPProject)), None)
        if at is not None:
            ts.insert(at + 1, BroadcastAnchor(anchor, self))


class ShardedRows:
    """GEP's anchor-gradient function ``(model, x, y, names) -> G`` (m x p), computed by each process
    on its block of the m anchors and all-gathered: the same rows as one process computes."""

    def __init__(self, gradients, world: World):
        self.gradients = gradients
        self.world = world

    def __call__(self, model, x, y, names: Sequence[str]) -> torch.Tensor:
        m, w = x.shape[0], self.world
        per = math.ceil(m / w.size)
        lo, hi = min(m, w.rank * per), min(m, (w.rank + 1) * per)
        if hi > lo:
            G = self.gradients(model, x[lo:hi], y[lo:hi], names)
        else:
            params = dict(model.named_parameters())
            G = torch.zeros(0, sum(params[n].numel() for n in names), device=x.device)
        return w.all_gather_rows(G, m)


class BroadcastAnchor(Transform):
    """Right after GEP's projection computed (or kept) the anchor bases: process 0's bases on every
    process, each time the anchor recomputes them (its ``refreshes`` count, or else its ``step``, changes)."""

    def __init__(self, anchor, world: World):
        self.anchor = anchor
        self.world = world
        self._sent = object()

    def begin_step(self, ctx: StepContext) -> None:
        at = getattr(self.anchor, "refreshes", getattr(self.anchor, "step", None))
        if at is None or at != self._sent:
            for B in self.anchor.bases:
                self.world.broadcast_(B)
            self._sent = at


# -- which world a process is in ------------------------------------------------------------------
def backend_for(device: torch.device) -> str:
    """NCCL for CUDA devices (when built with it), gloo otherwise."""
    import torch.distributed as dist

    return "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"


def launched_by_torchrun() -> bool:
    """Started by ``torchrun`` (or another launcher that sets ``WORLD_SIZE`` > 1 and ``MASTER_ADDR``)."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1) > 1 and "MASTER_ADDR" in os.environ and "RANK" in os.environ


def current_world(device: torch.device) -> World:
    """The world of this process, found automatically: the initialised default process group, else
    one initialised from ``torchrun``'s environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT``; ``LOCAL_RANK`` picks the GPU), else one process. ``device``: the resolved
    device; CUDA becomes this process's GPU."""
    import torch.distributed as dist

    if not dist.is_available():
        return World(device=device)
    if not dist.is_initialized():
        if not launched_by_torchrun():
            return World(device=device)
        if device.type == "cuda":
            torch.cuda.set_device(_local_gpu(int(os.environ["RANK"])))
        dist.init_process_group(backend_for(device), init_method="env://", timeout=TIMEOUT)
    rank, size = dist.get_rank(), dist.get_world_size()
    if device.type == "cuda":
        device = torch.device("cuda", _local_gpu(rank))
        torch.cuda.set_device(device)
    comm = device if dist.get_backend() == "nccl" else torch.device("cpu")
    return World(rank, size, device, comm)


def _local_gpu(rank: int) -> int:
    count = torch.cuda.device_count()
    local = int(os.environ.get("LOCAL_RANK", rank % max(1, count)))
    if local >= count:
        raise GSDError(f"process {rank} needs GPU {local} but {count} are visible; start at most {count} processes per machine")
    return local
