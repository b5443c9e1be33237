"""GEP inside an Opacus training script: :class:`GEPOptimizer`, its accountant and secret randomness.

A user with an Opacus loop (``model(x)``, ``loss.backward()``, ``optimizer.step()``) gets Gradient
Embedding Perturbation (paper 000) on public anchor data by swapping the optimizer:

.. code-block:: python

    from .opacus import make_private, public_examples
    anchors = public_examples("mnist-b", 200, 28, 1)        # the public set gsd rank chose
    model, optimizer, loader = make_private(model, optimizer, loader, public_x=anchors, num_classes=10,
                                            target_epsilon=2.0, delta=1e-5, epochs=5, k=50)
    ...                                                       # the same training loop
    optimizer.epsilon(1e-5)                                   # spent so far, accounted as gsd does

or, after ``PrivacyEngine.make_private``, ``GEPOptimizer.from_dp_optimizer(optimizer, module=model,
data_loader=loader, privacy_engine=engine, public_x=..., num_classes=...)`` (the engine's
``max_grad_norm`` is then unused: GEP clips the embedding to S1 and the residual to S2; the loader's
Poisson sampler is switched to a generator seeded from the OS).

**The maths is gsd's.** :class:`GEPOptimizer` is an Opacus :class:`~opacus.optimizers.DPOptimizer`
whose ``clip_and_accumulate`` stacks Opacus's per-sample gradients (``p.grad_sample``, in optimizer
order) into G (n x p) and runs them through the transform chain of ``gsd train --method gep``
(:func:`gsd_cli.train.methods.build_method`: :class:`~gsd_cli.train.gep.GEPProject`, clip S1 and S2;
the anchor basis of :func:`gsd_cli.train.gep.anchor_for` from the public examples at the current
weights), summing in float64 across physical batches (Opacus's ``BatchMemoryManager`` works), and
whose ``add_noise`` runs the chain's aggregated half (noise sigma S1 and sigma S2 from the step's
generator, then :class:`~gsd_cli.train.gep.GEPReconstruct`) and writes the update into ``p.grad``;
Opacus then divides by the expected batch size and steps the wrapped optimizer, as ``gsd train`` does.
Same weights, subsample, step number and noise generator give the same update
(tests/test_opacus_gep.py compares one step with :func:`gsd_cli.train.step.private_step`).

**Accounting.** Each step releases the embedding and the residual of the *same* Poisson subsample:
one subsampled Gaussian with effective multiplier (z1^-2 + z2^-2)^-1/2 = sigma / sqrt(2) (paper 000,
Theorem 3.1; DESIGN.md, "GEP"; :mod:`gsd_cli.privacy.accountant`). Opacus's accountants would book
``noise_multiplier`` = sigma per step and under-count, so :class:`GEPAccountant` (an Opacus
accountant; ``optimizer.accountant``, and ``privacy_engine.accountant`` after ``from_dp_optimizer``)
books the steps with gsd's accountant: :func:`gep_epsilon` of ``gsd train`` for the same q, steps
and sigma, to the bit.

**Private randomness** comes from the operating system (:mod:`gsd_cli.privacy.randomness`): the
noise generator and, with :func:`make_private`, the Poisson sampler's generator are seeded from
:func:`secrets.randbits`, never from ``torch.manual_seed`` (which an Opacus script's default
generators would use; ``from_dp_optimizer`` switches the loader Opacus made, which draws from torch's
global generator, to such a generator). ``insecure_seed=N`` derives both from N for experiments: the run is then not
DP (``optimizer.dp`` is False). Opacus's ``secure_mode`` noise is not used (gsd train's is), so an
optimizer made with ``secure_mode=True`` is refused rather than silently weakened.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager

import torch
from opacus.accountants.accountant import IAccountant
from opacus.optimizers.optimizer import DPOptimizer, _check_processed_flag, _mark_as_processed

from ..errors import GSDError
from ..privacy import calibrate_noise, effective_noise_multiplier, epsilon_of, gep_step_event, training_event
from ..privacy.randomness import private_rng
from ..train.config import TrainConfig, validate
from ..train.gep import anchor_for
from ..train.methods import build_method
from ..train.transforms import StepContext, chain_step_event


#: The hook tables of an nn.Module that run on a forward or backward pass.
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def secret_generator(insecure_seed: int | None = None, stream: str = "noise") -> torch.Generator:
    """A CPU :class:`torch.Generator` for private randomness: seeded from the operating system, or
    (experiments only, not DP) from ``insecure_seed`` and the name of the ``stream``."""
    return torch.Generator().manual_seed(int(private_rng(f"opacus-{stream}", insecure_seed).integers(2**63)))


def gep_event(noise_multiplier: float, residual: bool = True):
    """One GEP step (embedding and residual, both with multiplier sigma) as gsd train declares it."""
    return gep_step_event(noise_multiplier, noise_multiplier if residual else None)


def gep_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float, *, residual: bool = True,
                accountant: str = "rdp") -> float:
    """Epsilon of ``steps`` GEP steps at sampling rate q = ``sample_rate`` with multiplier sigma, by
    gsd's accountant: one Poisson-subsampled Gaussian of multiplier sigma / sqrt(2) per step (B-GEP,
    ``residual=False``: sigma), exactly as ``gsd train`` reports it."""
    return epsilon_of(training_event(gep_event(noise_multiplier, residual), sample_rate, steps), delta, accountant)


def gep_noise_multiplier(target_epsilon: float, delta: float, sample_rate: float, steps: int, *, residual: bool = True,
                         accountant: str = "rdp") -> float:
    """The smallest sigma whose ``steps`` GEP steps are (target_epsilon, delta)-DP: ``gsd train``'s
    calibration (:func:`gsd_cli.privacy.calibrate_noise`), so the same sigma for the same inputs."""
    return calibrate_noise(lambda z: gep_event(z, residual), target_epsilon, delta, sample_rate, steps, accountant)


class GEPAccountant(IAccountant):
    """An Opacus accountant for GEP steps: ``step(noise_multiplier=sigma, sample_rate=q)`` books one
    step releasing embedding and residual with multiplier sigma each (one Gaussian of sigma / sqrt(2));
    :meth:`get_epsilon` composes the history with gsd's accountant (``"rdp"`` or ``"pld"``)."""

    def __init__(self, residual: bool = True, accountant: str = "rdp"):
        self.history: list[tuple[float, float, int]] = []  # (sigma, q, steps), as Opacus's RDP accountant
        self.residual = residual
        self.accountant = accountant

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        if self.history and self.history[-1][:2] == (noise_multiplier, sample_rate):
            z, q, n = self.history[-1]
            self.history[-1] = (z, q, n + 1)
        else:
            self.history.append((noise_multiplier, sample_rate, 1))

    def get_epsilon(self, delta: float, *args, **kwargs) -> float:
        if not self.history:
            return 0.0
        from dp_accounting.dp_event import ComposedDpEvent

        events = [training_event(gep_event(z, self.residual), q, n) for z, q, n in self.history]
        return epsilon_of(events[0] if len(events) == 1 else ComposedDpEvent(events), delta, self.accountant)

    def __len__(self) -> int:
        return sum(n for _, _, n in self.history)

    @classmethod
    def mechanism(cls) -> str:
        return "gsd-gep"


def public_examples(name: str, m: int, input_size: int, channels: int, seed: int = 0, device=None) -> torch.Tensor:
    """``m`` examples of the public dataset ``name`` (any name ``gsd rank`` takes) as model input
    (m x channels x input_size x input_size), drawn as ``gsd train --public-examples m --seed seed``."""
    from .. import data as gdata

    return gdata.draw(gdata.resolve(name), m, seed).tensor(input_size, channels, device)


class GEPOptimizer(DPOptimizer):
    """An Opacus :class:`~opacus.optimizers.DPOptimizer` that releases GEP instead of clipped
    gradients (see the module docstring).

    ``optimizer``: the torch optimizer to wrap (``gsd train`` uses SGD with momentum and weight
    decay); ``module``: the model (Opacus's :class:`~opacus.GradSampleModule` or the module it wraps),
    whose parameters the optimizer holds; ``public_x``: the public anchor examples as model input;
    ``num_classes``: the model's label space (the anchors get random labels in it each step);
    ``noise_multiplier``: sigma (noise sigma S1 on the embedding, sigma S2 on the residual);
    ``expected_batch_size``: the divisor of the noisy sum (Opacus's, and ``gsd train --batch-size``);
    ``sample_rate``: q, to book each step in :attr:`accountant` (None: no booking). The GEP settings
    are ``gsd train``'s (``k``, ``clip_embedding`` S1, ``clip_residual`` S2, ``residual``,
    ``power_iters``, ``groups``, ``anchor_every``, ``anchor_warm``, ``seed``: the public seed of the
    anchors' labels). ``generator``: a CPU generator for the noise (default: :func:`secret_generator`
    from the OS, or from ``insecure_seed``). ``steps_per_epoch``: lets ``anchor_every`` > 1 recompute
    the basis at each epoch's first step, as gsd train does. :attr:`steps_taken` is the number of the
    next step (the anchors' labels depend on it)."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, module: torch.nn.Module, public_x: torch.Tensor, num_classes: int,
                 noise_multiplier: float, expected_batch_size: int | None, sample_rate: float | None = None,
                 k: int = 100, clip_embedding: float = 2.0, clip_residual: float = 1.0, residual: bool = True,
                 power_iters: int = 1, groups: str = "none", anchor_every: int = 1, anchor_warm: bool = False,
                 seed: int = 0, multilabel: bool = False, chunk: int = 64, loss_reduction: str = "mean",
                 generator: torch.Generator | None = None, insecure_seed: int | None = None,
                 steps_per_epoch: int | None = None, accountant: str = "rdp"):
        if not noise_multiplier >= 0:
            raise GSDError(f"noise_multiplier must be >= 0 (got {noise_multiplier})")
        gen = generator if generator is not None else secret_generator(insecure_seed, "noise")
        super().__init__(optimizer, noise_multiplier=noise_multiplier, max_grad_norm=clip_embedding,
                         expected_batch_size=expected_batch_size, loss_reduction=loss_reduction, generator=gen)
        self.module = module
        self.net = getattr(module, "_module", module)  # the model itself (a GradSampleModule wraps it)
        named = {id(p): n for n, p in self.net.named_parameters()}
        if any(id(p) not in named for p in self.params):
            raise GSDError("the optimizer holds parameters that are not the module's; build it from module.parameters()")
        self.names = [named[id(p)] for p in self.params]
        self.cfg = TrainConfig(method="gep", public="opacus public_x", public_examples=int(public_x.shape[0]), k=k, groups=groups,
                               power_iters=power_iters, clip_embedding=clip_embedding, clip_residual=clip_residual,
                               residual=residual, anchor_every=anchor_every, anchor_warm=anchor_warm, seed=seed, model="opacus")
        validate(self.cfg)  # gsd train's checks and messages
        self.device = self.params[0].device
        self.anchor = anchor_for(self.cfg, public_x.to(self.device), self.net, self.names, num_classes, multilabel, chunk, self.device)
        self._build(noise_multiplier)
        self.sample_rate = sample_rate
        self.steps_per_epoch = steps_per_epoch
        self.steps_taken = 0
        self.info: dict = {}  # what the transforms count (fraction clipped, residual energy), over all steps
        self.dp = insecure_seed is None
        self.accountant = GEPAccountant(residual, accountant)
        self._sums: dict | None = None
        self._ctx: StepContext | None = None
        if sample_rate is not None:
            self.attach_step_hook(self.accountant.get_optimizer_hook_fn(sample_rate))

    @classmethod
    def from_dp_optimizer(cls, dp_optimizer: DPOptimizer, *, module: torch.nn.Module, public_x: torch.Tensor, num_classes: int,
                          data_loader=None, sample_rate: float | None = None, privacy_engine=None,
                          insecure_seed: int | None = None, **gep) -> "GEPOptimizer":
        """The GEP optimizer replacing an Opacus ``PrivacyEngine.make_private`` optimizer: its wrapped
        optimizer, noise multiplier, expected batch size and loss reduction. ``data_loader``: the
        Poisson loader ``make_private`` returned (required): its sampler is switched, in place, to a
        generator seeded from the operating system (:func:`secret_generator`), since Opacus leaves it on
        torch's global generator (then ``torch.manual_seed`` reproduces every batch, and the
        subsampling the accountant books as secret is not). ``sample_rate``: q (default: the loader's).
        With ``privacy_engine``, its accountant becomes this optimizer's :class:`GEPAccountant` (so
        ``privacy_engine.get_epsilon(delta)`` is GEP's epsilon)."""
        if type(dp_optimizer) is not DPOptimizer:
            raise GSDError(f"GEP replaces Opacus's flat-clipping DPOptimizer, not {type(dp_optimizer).__name__} "
                           "(make_private with clipping='flat', no distributed or ghost mode)")
        if dp_optimizer.secure_mode:
            raise GSDError("GEP draws gsd train's noise, not Opacus's secure_mode noise; use PrivacyEngine(secure_mode=False) "
                           "(the noise generator is still seeded from the operating system)")
        q = secure_poisson_loader(data_loader, insecure_seed)
        sample_rate = q if sample_rate is None else sample_rate
        opt = cls(dp_optimizer.original_optimizer, module=module, public_x=public_x, num_classes=num_classes,
                  noise_multiplier=dp_optimizer.noise_multiplier, expected_batch_size=dp_optimizer.expected_batch_size,
                  loss_reduction=dp_optimizer.loss_reduction, sample_rate=sample_rate, insecure_seed=insecure_seed, **gep)
        if privacy_engine is not None:
            privacy_engine.accountant = opt.accountant
        return opt

    def _build(self, sigma: float) -> None:
        """The chain of gsd train's GEP with multiplier ``sigma``, checked against its accounted event."""
        self.method = build_method(self.cfg, sigma, self.anchor)
        declared, accounted = (effective_noise_multiplier(e) for e in (chain_step_event(self.method.chain), self.method.step_event(sigma)))
        if abs(declared - accounted) > 1e-12 * max(1.0, accounted):  # as gsd train checks it
            raise GSDError("internal: the GEP chain's noise does not match its accounted event")
        self._sigma = sigma

    @contextmanager
    def _hooks_off(self):
        """The model's module hooks (Opacus's per-sample hooks) set aside while the anchor gradients
        are computed: they would record the public examples as a private batch, and torch.func cannot
        run through full backward hooks. Restored as they were (same dicts, so their handles stay valid)."""
        saved = [(m, attr, getattr(m, attr)) for m in self.net.modules() for attr in _HOOK_DICTS if getattr(m, attr, None)]
        for m, attr, _ in saved:
            object.__setattr__(m, attr, OrderedDict())
        try:
            yield
        finally:
            for m, attr, hooks in saved:
                object.__setattr__(m, attr, hooks)

    def _begin(self) -> None:
        epoch = self.steps_taken // self.steps_per_epoch if self.steps_per_epoch else 0
        self._ctx = StepContext(step=self.steps_taken, model=self.net, names=self.names, generator=self.generator,
                                device=self.device, info=self.info, epoch=epoch)
        with self._hooks_off():
            self.method.chain.begin_step(self._ctx)  # the anchor basis at the current weights (public data only)

    def clip_and_accumulate(self) -> None:
        """Project each example's gradient on the anchor basis, clip embedding and residual, and add
        the clipped parts to the step's float64 sums (one call per physical batch)."""
        samples = self.grad_samples
        for p in self.params:
            _check_processed_flag(p.grad_sample)
        n = samples[0].shape[0]
        G = torch.cat([g.reshape(n, -1).to(p.dtype) for g, p in zip(samples, self.params)], dim=1)
        if self._ctx is None:
            self._begin()
        parts = self.method.chain.per_example({"grad": G}, self._ctx)
        sums = {key: v.sum(0, dtype=torch.float64) for key, v in parts.items()}
        self._dtypes = {key: v.dtype for key, v in parts.items()}
        self._sums = sums if self._sums is None else {key: self._sums[key] + sums[key] for key in sums}
        for p in self.params:
            _mark_as_processed(p.grad_sample)

    def add_noise(self) -> None:
        """Noise the summed embedding and residual, map back (v = w~ B + r~) and set ``p.grad``."""
        if self.noise_multiplier != self._sigma:  # an Opacus noise scheduler changed it; the hook books the new one
            self._build(self.noise_multiplier)
        sums = {key: v.to(self._dtypes[key]) for key, v in self._sums.items()}
        v = self.method.chain.aggregated(sums, self._ctx)["grad"]
        col = 0
        for p in self.params:
            w = p.numel()
            p.grad = v[col : col + w].view_as(p).to(p.dtype).clone()
            col += w
        self._sums, self._ctx = None, None
        self.steps_taken += 1

    def zero_grad(self, set_to_none: bool = False) -> None:
        if not self._is_last_step_skipped:  # a step in progress (virtual batches) keeps its sums
            self._sums, self._ctx = None, None
        super().zero_grad(set_to_none)

    def epsilon(self, delta: float) -> float:
        """Epsilon spent by the steps taken (:class:`GEPAccountant`; needs ``sample_rate``)."""
        if self.sample_rate is None:
            raise GSDError("this GEPOptimizer books no steps: give sample_rate (Opacus: 1 / len(data_loader))")
        return self.accountant.get_epsilon(delta)


def secure_poisson_loader(data_loader, insecure_seed: int | None = None) -> float:
    """Switch an Opacus Poisson loader's sampler, in place, to a generator seeded from the operating
    system (``insecure_seed``: from that seed, not DP) and return its sampling rate. Refuses a loader
    that is not Poisson-sampled (the accountant books Poisson subsampling) or none at all."""
    from opacus.utils.uniform_sampler import DistributedUniformWithReplacementSampler, UniformWithReplacementSampler

    sampler = getattr(data_loader, "batch_sampler", None)
    if not isinstance(sampler, (UniformWithReplacementSampler, DistributedUniformWithReplacementSampler)):
        raise GSDError("from_dp_optimizer needs data_loader=, the Poisson loader that PrivacyEngine.make_private returned: "
                       "GEP's accounting assumes its sampling, and gsd seeds it from the operating system "
                       f"(got {type(data_loader).__name__ if data_loader is not None else 'none'})")
    sampler.generator = secret_generator(insecure_seed, "sampling")
    return float(sampler.sample_rate)


def make_private(module: torch.nn.Module, optimizer: torch.optim.Optimizer, data_loader, *, public_x: torch.Tensor,
                 num_classes: int, noise_multiplier: float | None = None, target_epsilon: float | None = None,
                 epochs: int | None = None, delta: float = 1e-5, accountant: str = "rdp", insecure_seed: int | None = None,
                 sample_rate: float | None = None, **gep):
    """Opacus's ``PrivacyEngine.make_private`` for GEP: returns ``(GradSampleModule, GEPOptimizer,
    DPDataLoader)``. The loader samples each example with probability q (Poisson) from a generator
    seeded by the OS (:func:`secret_generator`); give ``noise_multiplier``, or ``target_epsilon`` and
    ``epochs`` to calibrate sigma for epochs x (steps per epoch) at ``delta`` (:func:`gep_noise_multiplier`).
    ``gep``: the GEP settings of :class:`GEPOptimizer` (``k``, ``clip_embedding``, ``clip_residual``, ``seed``...).

    q: by default Opacus's convention, 1 / len(data_loader) with len(data_loader) steps per epoch and
    the expected batch size q N, which treats the private set's size N as public (as Opacus does: the
    published q and steps give N away, roughly). Pass ``sample_rate`` (public) for a mechanism that does
    not depend on N (``gsd train --sampling-rate``): round(1 / q) steps per epoch and the loader's
    ``batch_size`` as the expected batch size."""
    from opacus import GradSampleModule
    from opacus.data_loader import DPDataLoader
    from opacus.validators import ModuleValidator

    problems = ModuleValidator.validate(module, strict=False)
    if problems:
        raise GSDError(f"Opacus cannot compute per-sample gradients of this model: {str(problems[0]).splitlines()[0]}; "
                       "fix it with opacus.validators.ModuleValidator.fix(model)")
    if sample_rate is None:  # Opacus's convention: N treated as public (docstring)
        loader = DPDataLoader.from_data_loader(data_loader, generator=secret_generator(insecure_seed, "sampling"))
        sample_rate, steps_per_epoch = 1 / len(data_loader), len(data_loader)
        expected_batch = int(len(data_loader.dataset) * sample_rate)
    else:
        if not (isinstance(sample_rate, (int, float)) and 0 < sample_rate <= 1) or not data_loader.batch_size:
            raise GSDError(f"sample_rate must be in (0, 1] and the loader must have a batch_size (got {sample_rate!r})")
        loader = DPDataLoader(data_loader.dataset, sample_rate=float(sample_rate), collate_fn=data_loader.collate_fn,
                              num_workers=data_loader.num_workers, generator=secret_generator(insecure_seed, "sampling"))
        steps_per_epoch, expected_batch = max(1, round(1 / sample_rate)), int(data_loader.batch_size)
    if (noise_multiplier is None) == (target_epsilon is None):
        raise GSDError("give either noise_multiplier or target_epsilon (with epochs)")
    if noise_multiplier is None:
        if not epochs or epochs < 1:
            raise GSDError("target_epsilon needs epochs (>= 1): sigma is calibrated for epochs x len(data_loader) steps")
        noise_multiplier = gep_noise_multiplier(target_epsilon, delta, sample_rate, epochs * steps_per_epoch,
                                                residual=gep.get("residual", True), accountant=accountant)
    gsm = GradSampleModule(module, loss_reduction="mean")
    gsm.forbid_grad_accumulation()  # as Opacus does with Poisson sampling: one backward per physical batch
    opt = GEPOptimizer(optimizer, module=gsm, public_x=public_x, num_classes=num_classes, noise_multiplier=noise_multiplier,
                       expected_batch_size=expected_batch, sample_rate=sample_rate,
                       insecure_seed=insecure_seed, accountant=accountant, steps_per_epoch=steps_per_epoch, **gep)
    return gsm, opt, loader


__all__ = ["GEPAccountant", "GEPOptimizer", "gep_epsilon", "gep_event", "gep_noise_multiplier", "make_private",
           "public_examples", "secret_generator", "secure_poisson_loader"]
