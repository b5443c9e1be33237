"""GEP's anchor basis reused across steps (issue 21): ``--anchor-every N``, ``--anchor-warm`` and
``--anchor-batch B`` (B of the anchors drawn per recomputation).

anchor-every 1 is paper 000's algorithm bit for bit; a warm-started power iteration finds the same
subspace as a cold one; the basis is recomputed only every N steps (and at each epoch's first step,
so a resumed run is exact); the privacy accounting does not depend on N; bad values are one-line errors.
"""

import json

import numpy as np
import pytest
import torch

from gsd_cli.cli import main
from gsd_cli.errors import GSDError
from gsd_cli.gradients import gradient_matrix
from gsd_cli.train import Anchor, StepContext, TrainConfig, train
from gsd_cli.train import gep as gep_module
from gsd_cli.train.config import validate
from gsd_cli.train.gep import power_basis


def _max_angle(B: torch.Tensor, W: torch.Tensor) -> float:
    """Largest principal angle (radians) between the row spaces of B and W (orthonormal rows)."""
    cosines = torch.linalg.svdvals(B.double() @ W.double().T)
    return float(torch.arccos(cosines.min().clamp(max=1.0)))


def _low_rank_plus_tail(m=300, p=400, k=6, seed=0):
    """A synthetic 'gradient matrix' with a clear top-k right singular subspace, and that subspace."""
    g = torch.Generator().manual_seed(seed)
    U, _ = torch.linalg.qr(torch.randn(m, m, generator=g, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(p, p, generator=g, dtype=torch.float64))
    s = torch.cat([torch.tensor([10.0, 9, 8, 7, 6, 5]), 0.5 * 0.98 ** torch.arange(m - k, dtype=torch.float64)])
    G = (U * s) @ V[:, :m].T
    top = torch.linalg.svd(G, full_matrices=False)[2][:k]
    return G, top, g


def _tiny_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _grads(model, x, y, names):
    return gradient_matrix(model, [(x, y)], x.shape[0], names, None, "vmap", "cpu", "none")


def _names(model):
    return [n for n, _ in model.named_parameters()]


def _paper_basis(model, x, seed, step, k, iters, num_classes=3):
    """Paper 000's per-step basis as gsd computed it before anchor reuse existed: labels and the
    Gaussian start from (seed, step), ``iters`` power iterations, QR in float64 (one group)."""
    gen = torch.Generator().manual_seed(int(np.random.default_rng([seed, step, 7]).integers(2**62)))
    y = torch.randint(0, num_classes, (x.shape[0],), generator=gen)
    G = _grads(model, x, y, _names(model))
    gen = torch.Generator().manual_seed(int(np.random.default_rng([seed, step, 11]).integers(2**62)))
    B = torch.randn(k, G.shape[1], generator=gen, dtype=torch.float64).to(G.dtype)
    for _ in range(iters):
        B = (G @ B.T).T @ G
        Q, _ = torch.linalg.qr(B.T.double())
        B = Q.T.to(G.dtype)
    return B


@pytest.mark.parametrize("iters", [1, 2])
def test_anchor_every_1_is_the_papers_basis_at_every_step(iters):
    model = _tiny_model()
    x = torch.randn(20, 12, generator=torch.Generator().manual_seed(1))
    p = sum(w.numel() for w in model.parameters())
    anchor = Anchor(x, 3, 4, [list(range(p))], iters, 5, _grads)  # the default: every=1, cold
    assert anchor.every == 1 and not anchor.warm
    for step in range(3):
        with torch.no_grad():  # the weights move between steps, as in training
            for w in model.parameters():
                w.add_(0.05 * torch.randn(w.shape, generator=torch.Generator().manual_seed(10 + step)))
        anchor.compute(StepContext(step=step, model=model, names=_names(model)))
        assert torch.equal(anchor.bases[0], _paper_basis(model, x, 5, step, 4, iters))
    assert anchor.refreshes == 3


def test_warm_start_converges_to_the_cold_subspace():
    G, top, _ = _low_rank_plus_tail()
    k = top.shape[0]
    B = None
    for _ in range(8):  # warm: each call one iteration from the previous basis
        B = power_basis(G, k, 1, torch.Generator().manual_seed(1), start=B)
    cold = power_basis(G, k, 8, torch.Generator().manual_seed(2))  # cold: 8 iterations from another start
    assert _max_angle(B, top) < 1e-4 and _max_angle(cold, top) < 1e-4 and _max_angle(B, cold) < 1e-4
    assert torch.allclose(B @ B.T, torch.eye(k, dtype=B.dtype), atol=1e-10)
    random = torch.linalg.qr(torch.randn(G.shape[1], k, generator=torch.Generator().manual_seed(3), dtype=torch.float64))[0].T
    assert _max_angle(random, top) > 0.5  # the measure can fail: a random subspace is far


def test_warm_start_tracks_a_drifting_subspace_better_than_one_cold_iteration():
    G, _, g = _low_rank_plus_tail()
    k = 6
    E = 0.02 * torch.randn(G.shape, generator=g, dtype=torch.float64)
    warm = power_basis(G, k, 5, torch.Generator().manual_seed(3))
    for t in range(1, 5):
        Gt = G + t * E
        top = torch.linalg.svd(Gt, full_matrices=False)[2][:k]
        warm = power_basis(Gt, k, 1, None, start=warm)
        cold = power_basis(Gt, k, 1, torch.Generator().manual_seed(10 + t))
        assert _max_angle(warm, top) < 0.05 < _max_angle(cold, top)


def test_warm_start_follows_the_matrix_and_checks_its_shape():
    G = torch.randn(30, 40, generator=torch.Generator().manual_seed(0))  # float32
    start = torch.linalg.qr(torch.randn(40, 3, dtype=torch.float64))[0].T
    B = power_basis(G, 3, 1, None, start=start)
    assert B.dtype == G.dtype and B.device == G.device and B.shape == (3, 40)
    with pytest.raises(ValueError, match="warm start"):
        power_basis(G, 4, 1, None, start=start)


def _counting_anchor(every, warm=False):
    model = _tiny_model()
    p = sum(w.numel() for w in model.parameters())
    calls = []

    def grads(model_, x, y, names):
        calls.append(1)
        return _grads(model_, x, y, names)

    x = torch.randn(16, 12, generator=torch.Generator().manual_seed(2))
    return Anchor(x, 3, 4, [list(range(p))], 1, 0, grads, every=every, warm=warm), model, calls


@pytest.mark.parametrize("warm", [False, True])
def test_the_basis_is_recomputed_every_n_steps_and_at_each_epoch(warm):
    anchor, model, calls = _counting_anchor(5, warm)
    names = _names(model)
    seen = []
    for step in range(12):  # one epoch of 12 steps: recomputed at 0, 5, 10
        anchor.compute(StepContext(step=step, model=model, names=names, epoch=0))
        anchor.compute(StepContext(step=step, model=model, names=names, epoch=0))  # a second call in the step: no work
        seen.append(anchor.bases[0].clone())
    assert anchor.refreshes == 3 and len(calls) == 3
    assert all(torch.equal(seen[i], seen[0]) for i in range(5)) and not torch.equal(seen[5], seen[4])
    assert all(torch.equal(seen[i], seen[5]) for i in range(5, 10)) and not torch.equal(seen[10], seen[9])
    for step in range(12, 20):  # the next epoch's first step recomputes, whatever the count: 12, 17
        anchor.compute(StepContext(step=step, model=model, names=names, epoch=1))
    assert anchor.refreshes == 5 and anchor.refreshed_at == 17


def test_warm_refresh_starts_from_the_held_basis_and_cold_at_an_epoch(monkeypatch):
    anchor, model, _ = _counting_anchor(2, warm=True)
    starts = []
    real = gep_module.power_basis

    def spy(G, k, iters, generator, start=None):
        starts.append(None if start is None else start.clone())
        return real(G, k, iters, generator, start)

    monkeypatch.setattr(gep_module, "power_basis", spy)
    names = _names(model)
    for step, epoch in [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1)]:
        before = [b.clone() for b in anchor.bases]
        anchor.compute(StepContext(step=step, model=model, names=names, epoch=epoch))
        if step == 2:
            assert torch.equal(starts[-1], before[0])  # warm: from the previous basis
    assert [s is None for s in starts] == [True, False, True]  # steps 0 (first), 2 (warm), 3 (new epoch: cold)


def test_anchor_every_is_validated():
    for bad in (0, -3, 2.5, True, "5"):
        with pytest.raises(GSDError, match="--anchor-every must be a whole number") as e:
            validate(TrainConfig(public="mnist-b", anchor_every=bad))
        assert "\n" not in str(e.value)
        with pytest.raises(GSDError, match="--anchor-every"):
            Anchor(torch.zeros(2, 3), 2, 1, [[0, 1]], 1, 0, _grads, every=bad)
    validate(TrainConfig(public="mnist-b", anchor_every=7))
    validate(TrainConfig(public="mnist-b", anchor_every=np.int64(3)))


def test_cli_refuses_anchor_every_0_in_one_line(capsys, tmp_path):
    code = main(["train", "--public", "mnist-b", "--anchor-every", "0", "--out", str(tmp_path / "run"), "-q"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "--anchor-every must be a whole number" in lines[0], err
    assert not (tmp_path / "run").exists()


def _cfg(tiny, **kw):
    base = dict(private=tiny["private"], public=tiny["public"], method="gep", epsilon=4.0, epochs=2, batch_size=30,
                k=8, public_examples=40, deterministic_noise=True, physical_batch=16, expected_size=100)
    return TrainConfig(**{**base, **kw})


def test_accounting_is_the_same_for_any_anchor_every_and_resume_is_exact(tiny, tmp_path, monkeypatch, interrupt):
    """100 private training examples, batch 30: 3 steps an epoch, 2 epochs. anchor-every 2 recomputes
    at steps 0, 2 (epoch 1) and 3, 5 (epoch 2; cold at 3, warm at 5): 4 power iterations instead of 6,
    the same sigma and epsilon; an interrupted run resumed after epoch 1 equals the straight one."""
    from safetensors.torch import load_file

    calls = []
    real = gep_module.power_basis
    monkeypatch.setattr(gep_module, "power_basis", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    runs = {}
    for every, warm in [(1, False), (2, True)]:
        calls.clear()
        s = train(_cfg(tiny, anchor_every=every, anchor_warm=warm), tmp_path / f"r{every}")
        assert len(calls) == {1: 6, 2: 4}[every]
        assert s["gep"]["anchor_every"] == every and s["gep"]["anchor_warm"] == warm
        runs[every] = s, json.loads((tmp_path / f"r{every}" / "summary.json").read_text())
    (ref, ref_pub), (s, pub) = runs[1], runs[2]
    assert s["sigma"] == ref["sigma"] and s["epsilon"] == ref["epsilon"] and s["privacy"] == ref["privacy"]
    assert s["budget"] == ref["budget"] and pub["privacy"] == ref_pub["privacy"]
    assert s["test"]["loss"] != ref["test"]["loss"]  # the option did act: another model

    cfg = _cfg(tiny, anchor_every=2, anchor_warm=True)
    with pytest.raises(interrupt.error):
        train(cfg, tmp_path / "resumed", progress=interrupt("epoch", 1))
    train(cfg, tmp_path / "resumed", resume=True)
    a = load_file(str(tmp_path / "r2" / "checkpoint.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "checkpoint.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(GSDError, match="anchor_every"):
        train(_cfg(tiny, anchor_every=3, anchor_warm=True), tmp_path / "resumed", resume=True)


def test_a_run_saved_before_anchor_reuse_resumes_with_the_papers_schedule(tiny, tmp_path, interrupt, capsys):
    """A checkpoint without anchor_every / anchor_warm was made with the basis at every step, cold:
    ``gsd train --resume`` goes on that way (not with today's defaults), and the library refuses
    today's defaults for it."""
    from safetensors.torch import load_file, save_file

    from gsd_cli.train import checkpoint as ckpt
    from gsd_cli.train.config import SAVED_BEFORE

    assert SAVED_BEFORE == {"anchor_every": 1, "anchor_warm": False, "anchor_batch": None,
                            "public_val": 0.0, "public_patience": 0, "public_augment": "none"}  # (stage 1's: issue 61)
    assert (TrainConfig().anchor_every, TrainConfig().anchor_warm) != (1, False)  # else this test tests nothing
    old = _cfg(tiny, anchor_every=1, anchor_warm=False)
    run = tmp_path / "old"
    with pytest.raises(interrupt.error):
        train(old, run, progress=interrupt("epoch", 1))
    meta = json.loads((run / "checkpoint.json").read_text())
    for key in SAVED_BEFORE:
        del meta["settings"][key]
    meta.pop("weights_sha256", None)  # an older run's checkpoint has no weights digest
    (run / "checkpoint.json").write_text(json.dumps(meta))
    wfile = run / "checkpoint.safetensors"  # as such a run's own weights would be: with its digest
    save_file(load_file(str(wfile)), str(wfile), metadata={**ckpt.tensor_metadata(wfile), "gsd_digest": ckpt.state_digest(meta)})
    with pytest.raises(GSDError, match="anchor_every: run has 1"):
        train(_cfg(tiny, anchor_every=TrainConfig().anchor_every, anchor_warm=TrainConfig().anchor_warm), run, resume=True)
    assert main(["train", "--resume", str(run), "-q"]) == 0, capsys.readouterr().err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["gep"]["anchor_every"] == 1 and summary["gep"]["anchor_warm"] is False and summary["epochs"] == 2


def test_anchor_batch_draws_b_distinct_anchors_per_recomputation_from_the_public_seed():
    model = _tiny_model()
    names, p = _names(model), sum(w.numel() for w in model.parameters())
    x = torch.randn(40, 12, generator=torch.Generator().manual_seed(3))
    seen = []

    def grads(model_, xa, ya, names_):
        seen.append((xa.clone(), ya.clone()))
        return _grads(model_, xa, ya, names_)

    anchor = Anchor(x, 3, 4, [list(range(p))], 1, 9, grads, every=1, warm=True, batch=15)
    draws = []
    for step in range(6):
        anchor.compute(StepContext(step=step, model=model, names=names, epoch=0))
        rows = anchor.rows(step)
        assert rows.shape == (15,) and len(set(rows.tolist())) == 15 and torch.equal(rows, rows.sort().values)
        assert 0 <= int(rows.min()) and int(rows.max()) < 40
        xa, ya = seen[-1]  # the gradients were taken at exactly those anchors, with their labels of this step
        assert torch.equal(xa, x[rows]) and torch.equal(ya, anchor.labels(step)[rows])
        draws.append(rows)
    assert len({tuple(r.tolist()) for r in draws}) == 6  # a new draw at every recomputation
    union = set().union(*(set(r.tolist()) for r in draws))
    assert len(union) > 30  # over the steps the draws cover most of the pool
    again = Anchor(x, 3, 4, [list(range(p))], 1, 9, grads, batch=15)
    assert all(torch.equal(again.rows(t), draws[t]) for t in range(6))  # from (seed, step): reproducible, public
    other = Anchor(x, 3, 4, [list(range(p))], 1, 10, grads, batch=15)
    assert not torch.equal(other.rows(0), draws[0])
    assert Anchor(x, 3, 4, [list(range(p))], 1, 9, grads, batch=40).rows(0) is None  # all of them: no draw
    assert Anchor(x, 3, 4, [list(range(p))], 1, 9, grads, batch=400).batch == 40
    assert Anchor(x, 3, 4, [list(range(p))], 1, 9, grads, batch=0).rows(0) is None  # 0: all, as the paper
    wide = Anchor(x, 3, 30, [list(range(p))], 1, 9, grads, batch=15)  # never fewer anchors than k
    assert wide.batch == 30 and wide.ks == [30] and wide.rows(0).shape == (30,)


def test_anchor_batch_is_validated(capsys, tmp_path):
    for bad in (-1, 2.5, True, "5"):
        with pytest.raises(GSDError, match="--anchor-batch must be a whole number") as e:
            validate(TrainConfig(public="mnist-b", anchor_batch=bad))
        assert "\n" not in str(e.value)
        with pytest.raises(GSDError, match="--anchor-batch"):
            Anchor(torch.zeros(2, 3), 2, 1, [[0, 1]], 1, 0, _grads, batch=bad)
    validate(TrainConfig(public="mnist-b", anchor_batch=500))
    validate(TrainConfig(public="mnist-b", anchor_batch=0))
    assert TrainConfig().anchor_batch == 128  # issue 33: the downstream benchmark's GEP settings
    code = main(["train", "--public", "mnist-b", "--anchor-batch", "-5", "--out", str(tmp_path / "run"), "-q"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and "--anchor-batch must be a whole number" in err[0]
    assert not (tmp_path / "run").exists()


def test_anchor_batch_leaves_the_accounting_unchanged(tiny, tmp_path):
    """The draw is public (seed, step): the same sigma, epsilon and ledger as all anchors; the option
    acts (another model) and is recorded in the summary."""
    ref = train(_cfg(tiny), tmp_path / "all")
    s = train(_cfg(tiny, anchor_batch=12), tmp_path / "some")
    assert s["sigma"] == ref["sigma"] and s["epsilon"] == ref["epsilon"] and s["privacy"] == ref["privacy"]
    assert s["gep"]["anchor_batch"] == 12 and ref["gep"]["anchor_batch"] == 40
    assert s["test"]["loss"] != ref["test"]["loss"]
