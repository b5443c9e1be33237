"""Issue 37, big catalogues: each public side is compared as it arrives and dropped; a worker process
keeps its model between tasks."""

import gc
import weakref

import numpy as np

import gsd_cli
from gsd_cli.ranking import executors


def _sets(tmp_path, n=6, m=12):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "priv.npz", x=rng.integers(0, 256, (m, 28, 28), dtype=np.uint8), y=np.arange(m) % 10,
             classes=np.array([str(i) for i in range(10)]))
    for i in range(n):
        np.savez(tmp_path / f"p{i}.npz", x=rng.integers(0, 256, (m, 28, 28), dtype=np.uint8), y=np.arange(m) % 10)
    return f"npz:{tmp_path / 'priv.npz'}", [f"npz:{tmp_path / f'p{i}.npz'}" for i in range(n)]


def test_public_sides_are_dropped_as_they_are_compared(tmp_path, monkeypatch):
    """At most one public basis is alive at a time (the one being compared), not all of them."""
    priv, pubs = _sets(tmp_path)
    alive: list = []
    most = [0]
    real = executors.LocalExecutor.run

    def run(self, tasks, compute):
        for task, sub in real(self, tasks, compute):
            gc.collect()
            most[0] = max(most[0], sum(r() is not None for r in alive))
            alive.append(weakref.ref(sub.V))
            yield task, sub

    monkeypatch.setattr(executors.LocalExecutor, "run", run)
    rk = gsd_cli.rank(priv, pubs, model="fmnist-cnn", params="fc*", k=2, examples=12, engine="vmap")
    assert len(rk.results) == 6 and most[0] == 0  # the previous side was freed before the next arrived
    held = gsd_cli.rank(priv, pubs, model="fmnist-cnn", params="fc*", k=2, examples=12, engine="vmap", memo={})
    assert [r.distance for r in held] == [r.distance for r in rk]  # the same ranking either way


def test_a_worker_keeps_its_model_between_tasks(tmp_path, monkeypatch):
    from gsd_cli import data as gdata
    from gsd_cli import peft
    from gsd_cli.distance import make_distance
    from gsd_cli.ranking import RankConfig

    priv, pubs = _sets(tmp_path, n=2)
    built = []
    real = peft.build_model
    monkeypatch.setattr(peft, "build_model", lambda *a, **k: built.append(1) or real(*a, **k))
    executors._WORKER_MODELS.clear()
    cfg = RankConfig.from_options(model="fmnist-cnn", params="fc*", k=2, examples=12, engine="vmap")
    _, net, names, _ = real("fmnist-cnn", 10, 0, params="fc*")
    side = executors.PublicSide(make_distance("gsd", cfg), gsd_cli.distance.SideContext(net, dims=1, common=dict(
        k=2, input_size=28, channels=1, num_classes=10, names=names, labels="random", row_norm="unit", seed=0, engine="vmap",
        device="cpu")))
    recipe = side.recipe()
    subs = [recipe.compute(gdata.draw(gdata.resolve(p), 12, 0), 0) for p in pubs]
    assert len(built) == 1 and all(s.V.shape[1] == 2 for s in subs)
