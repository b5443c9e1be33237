"""GEP inside Opacus (gsd_cli.integrations.opacus): the update of an Opacus step equals gsd train's for the same
weights, Poisson subsample and noise; the epsilon is gsd train's; the example script runs."""

import copy
import math
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from opacus import GradSampleModule
from opacus.accountants import RDPAccountant

from gsd_cli import data as gdata
from gsd_cli.errors import GSDError
from gsd_cli.integrations.opacus import GEPAccountant, GEPOptimizer, gep_epsilon, gep_noise_multiplier, make_private, secret_generator
from gsd_cli.train import StepContext, TrainConfig, build_method, train
from gsd_cli.train.gep import anchor_for
from gsd_cli.train.step import flat_to_grads, private_randomness, private_step

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "opacus_gep.py"
GEP = dict(k=6, clip_embedding=1.0, clip_residual=0.3, seed=5, anchor_every=1, anchor_warm=False)  # the basis recomputed every step on both sides


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 3, 5, stride=3), nn.Tanh(), nn.Flatten(), nn.Linear(3 * 8 * 8, 10))


@pytest.fixture(scope="module")
def mnist():
    """120 private examples of mnist-a:train and 30 public anchors of mnist-b (embedded data)."""
    src = gdata.resolve("mnist-a:train")
    idx = np.arange(120)
    x = gdata.to_model_input(gdata.read_images(src, idx), 28, 1, "cpu")
    pub = gdata.draw(gdata.resolve("mnist-b"), 30, 0).tensor(28, 1)
    return x, torch.as_tensor(src.labels(idx)), pub


def _gsd_steps(net, x, y, pub, sigma, batch, seeds):
    """gsd train's steps (private_step, then SGD on the noisy sum / expected batch size)."""
    names = [n for n, _ in net.named_parameters()]
    cfg = TrainConfig(method="gep", public="mnist-b", public_examples=pub.shape[0], **GEP)
    anchor = anchor_for(cfg, pub, net, names, 10, False, 64, torch.device("cpu"))
    method = build_method(cfg, sigma, anchor)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    p = sum(q.numel() for q in net.parameters())
    for step, (idx, gen) in enumerate(seeds):
        ctx = StepContext(step=step, model=net, names=names, generator=gen, info={})
        chunks = [(x[idx[i : i + 16]], y[idx[i : i + 16]]) for i in range(0, len(idx), 16)]
        flat_to_grads(net, names, private_step(method.chain, net, names, chunks, p, ctx)["grad"] / batch)
        opt.step()
        opt.zero_grad(set_to_none=True)


def _opacus_steps(net, x, y, pub, sigma, batch, seeds, q):
    """The same steps in an Opacus loop; each subsample in physical batches of 16 (as Opacus's
    BatchMemoryManager: every batch but the last is a skipped step that only accumulates)."""
    gsm = GradSampleModule(net)
    inner = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    gens = [torch.Generator() for _ in seeds]
    for g, (_, gen) in zip(gens, seeds):
        g.set_state(gen.get_state())
    opt = GEPOptimizer(inner, module=gsm, public_x=pub, num_classes=10, noise_multiplier=sigma, expected_batch_size=batch,
                       sample_rate=q, generator=gens[0], **GEP)
    for step, (idx, _) in enumerate(seeds):
        opt.generator = gens[step]  # the step's noise generator, as gsd train draws one per step
        starts = list(range(0, len(idx), 16))
        for i in starts:
            part = idx[i : i + 16]
            opt.zero_grad()
            nn.functional.cross_entropy(gsm(x[part]), y[part]).backward()
            if i != starts[-1]:
                opt.signal_skip_step(True)
            opt.step()
    return opt


def test_an_opacus_gep_step_is_gsd_trains_step(mnist):
    x, y, pub = mnist
    n, batch, sigma = x.shape[0], 40, 0.8
    q = batch / n
    seeds = [private_randomness(n, q, 1234, s) for s in range(2)]
    ref, got, other = _net(), _net(), _net()
    w0 = [p.detach().clone() for p in ref.parameters()]
    _gsd_steps(ref, x, y, pub, sigma, batch, [(i, copy.deepcopy(g)) for i, g in seeds])
    opt = _opacus_steps(got, x, y, pub, sigma, batch, [(i, copy.deepcopy(g)) for i, g in seeds], q)
    for (name, a), b, w in zip(ref.named_parameters(), got.parameters(), w0):
        assert (a - w).abs().max() > 1e-3, name  # the weights moved
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6, msg=name)
    assert opt.steps_taken == 2 and len(opt.accountant) == 2
    assert opt.info["clipped_embedding"][1] == sum(len(i) for i, _ in seeds)  # every example went through gsd's chain
    # another noise draw gives another update: the comparison above can fail
    _opacus_steps(other, x, y, pub, sigma, batch, [(i, torch.Generator().manual_seed(99)) for i, _ in seeds], q)
    assert max((a - b).abs().max() for a, b in zip(ref.parameters(), other.parameters())) > 1e-3


def test_the_epsilon_is_gsd_trains(tiny, tmp_path):
    s = train(TrainConfig(private=tiny["private"], public=tiny["public"], method="gep", epsilon=3.0, epochs=1, batch_size=30,
                          k=4, public_examples=10, insecure_seed=1, physical_batch=64, expected_size=100), tmp_path / "run")
    q, steps, sigma, delta = s["sampling_rate"], s["steps"], s["sigma"], s["delta"]  # (a declared size: no epsilon spent on it)
    assert gep_epsilon(sigma, q, steps, delta) == s["epsilon"]
    assert gep_noise_multiplier(3.0, delta, q, steps) == sigma  # the same calibration
    acc = GEPAccountant()
    for _ in range(steps):
        acc.step(noise_multiplier=sigma, sample_rate=q)
    assert acc.get_epsilon(delta) == s["epsilon"] and len(acc) == steps and acc.history == [(sigma, q, steps)]


def test_gep_accounting_against_opacus_and_design():
    """DESIGN.md's figure (q=0.02, T=1e4, sigma=2.08, delta=1e-5: 7.91, where two separately subsampled
    halves under-count 7.29), and Opacus's RDP accountant as an independent computation: one Gaussian of
    sigma / sqrt(2) per step; Opacus booking sigma (its default) says much less."""
    eps = gep_epsilon(2.08, 0.02, 10_000, 1e-5)
    assert eps == pytest.approx(7.91, abs=0.01)
    ref = RDPAccountant()
    ref.history = [(2.08 / math.sqrt(2), 0.02, 10_000)]
    assert eps == pytest.approx(ref.get_epsilon(1e-5), rel=0.02)
    naive = RDPAccountant()
    naive.history = [(2.08, 0.02, 10_000)]
    assert naive.get_epsilon(1e-5) < 0.7 * eps
    assert gep_epsilon(2.08, 0.02, 10_000, 1e-5, residual=False) == pytest.approx(naive.get_epsilon(1e-5), rel=0.02)  # B-GEP
    two = GEPAccountant()
    two.history = [(2.08, 0.02, 5_000), (1.5, 0.02, 5_000)]  # a noise schedule: composed, more than 10^4 steps at 2.08
    assert two.get_epsilon(1e-5) > eps


def test_noise_is_secret_unless_seeded(mnist):
    x, y, pub = mnist
    a, b = secret_generator(), secret_generator()
    assert not torch.equal(torch.randn(5, generator=a), torch.randn(5, generator=b))
    c, d = secret_generator(7), secret_generator(7)
    assert torch.equal(torch.randn(5, generator=c), torch.randn(5, generator=d))
    assert not torch.equal(torch.randn(5, generator=secret_generator(7, "sampling")), torch.randn(5, generator=secret_generator(7)))
    net = _net()
    opt = GEPOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), module=net, public_x=pub, num_classes=10,
                       noise_multiplier=1.0, expected_batch_size=10, **GEP)
    assert opt.dp and opt.generator is not None
    seeded = GEPOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), module=net, public_x=pub, num_classes=10,
                          noise_multiplier=1.0, expected_batch_size=10, insecure_seed=3, **GEP)
    assert not seeded.dp
    with pytest.raises(GSDError, match="sample_rate"):
        opt.epsilon(1e-5)


def test_user_errors_are_one_line(mnist):
    x, y, pub = mnist
    net, stranger = _net(), nn.Linear(2, 2)
    with pytest.raises(GSDError, match="not the module's"):
        GEPOptimizer(torch.optim.SGD(stranger.parameters(), lr=0.1), module=net, public_x=pub, num_classes=10,
                     noise_multiplier=1.0, expected_batch_size=10)
    with pytest.raises(GSDError, match="clip-embedding must be positive"):
        GEPOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), module=net, public_x=pub, num_classes=10,
                     noise_multiplier=1.0, expected_batch_size=10, clip_embedding=0.0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=20)
    with pytest.raises(GSDError, match="noise_multiplier or target_epsilon"):
        make_private(net, torch.optim.SGD(net.parameters(), lr=0.1), loader, public_x=pub, num_classes=10)
    with pytest.raises(GSDError, match="BatchNorm|ModuleValidator"):
        bn = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(2 * 26 * 26, 10))
        make_private(bn, torch.optim.SGD(bn.parameters(), lr=0.1), loader, public_x=pub, num_classes=10, noise_multiplier=1.0)


def test_from_privacy_engine_refuses_secure_mode_and_other_optimizers(mnist):
    from opacus.optimizers import DPOptimizer, DPPerLayerOptimizer

    x, y, pub = mnist
    net = _net()
    secure = DPOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0,
                         expected_batch_size=10, secure_mode=True)
    with pytest.raises(GSDError, match="secure_mode"):
        GEPOptimizer.from_dp_optimizer(secure, module=net, public_x=pub, num_classes=10, sample_rate=0.1)
    per_layer = DPPerLayerOptimizer(torch.optim.SGD(net.parameters(), lr=0.1), noise_multiplier=1.0,
                                    max_grad_norm=[1.0] * 4, expected_batch_size=10)
    with pytest.raises(GSDError, match="flat-clipping"):
        GEPOptimizer.from_dp_optimizer(per_layer, module=net, public_x=pub, num_classes=10, sample_rate=0.1)


@pytest.mark.parametrize("engine", [[], ["--privacy-engine", "--insecure-seed", "3"]])
def test_the_example_script_runs(engine, capsys):
    main = runpy.run_path(str(EXAMPLE), run_name="example")["main"]
    r = main(["--steps", "2", "--examples", "120", "--public-examples", "10", "--k", "4", "--batch-size", "40", *engine])
    assert r["steps"] == 2 and r["sample_rate"] == pytest.approx(1 / 3)
    assert r["epsilon"] == r["epsilon_gsd"] > r["epsilon_opacus_would_report"] > 0
    assert 0 <= r["test_accuracy"] <= 1 and r["dp"] is (not engine)
    if engine:
        assert r["epsilon_privacy_engine"] == r["epsilon"]
    assert '"epsilon"' in capsys.readouterr().out


def test_from_dp_optimizer_draws_batches_from_the_os(mnist):
    """Opacus's make_private leaves the Poisson loader on torch's global generator: two identical
    torch.manual_seed calls gave identical batches. After from_dp_optimizer they differ, and a call
    without the loader is refused."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader, TensorDataset

    x, y, pub = mnist

    def batches():
        net = _net()
        loader = DataLoader(TensorDataset(x[:200], y[:200]), batch_size=20)
        engine = PrivacyEngine()
        model, opt, dl = engine.make_private(module=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), data_loader=loader,
                                             noise_multiplier=1.0, max_grad_norm=1.0)
        assert dl.batch_sampler.generator is None  # the leak: torch's global generator
        with pytest.raises(GSDError, match="data_loader="):
            GEPOptimizer.from_dp_optimizer(opt, module=model, public_x=pub, num_classes=10)
        gep = GEPOptimizer.from_dp_optimizer(opt, module=model, data_loader=dl, public_x=pub, num_classes=10, privacy_engine=engine, k=4)
        assert gep.sample_rate == pytest.approx(1 / len(loader)) and dl.batch_sampler.generator is not None
        torch.manual_seed(123)
        return [sorted(b[1].tolist()) for b, _ in zip(dl, range(3))], [len(b[1]) for b, _ in zip(dl, range(3))]

    first, second = batches(), batches()
    assert first[0] != second[0]  # 3 Poisson batches: equal only by a negligible chance


def test_make_private_with_a_declared_sampling_rate_does_not_read_n(mnist):
    """With sample_rate (public), the mechanism (q, steps per epoch, sigma, expected batch) is the same
    for two data sets of different sizes; Opacus's convention (1 / len(loader)) is not."""
    from torch.utils.data import DataLoader, TensorDataset

    x, y, pub = mnist
    got = []
    for n in (100, 90):
        net = _net()
        loader = DataLoader(TensorDataset(x[:n], y[:n]), batch_size=20)
        _, opt, dl = make_private(net, torch.optim.SGD(net.parameters(), lr=0.1), loader, public_x=pub, num_classes=10,
                                  target_epsilon=2.0, epochs=1, sample_rate=0.2, k=4)
        got.append((opt.sample_rate, opt.steps_per_epoch, opt.noise_multiplier, opt.expected_batch_size, dl.sample_rate))
    assert got[0] == got[1] and got[0][0] == 0.2 and got[0][1] == 5 and got[0][3] == 20
