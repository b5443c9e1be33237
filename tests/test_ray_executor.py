"""The ``ray`` executor (issue 22): public subspaces as Ray tasks on a local Ray instance.

One Ray instance (2 CPUs) serves the module; its two workers are warmed up once (they import torch
and gsd_cli), so each test costs a few seconds. Every ranking here is tiny (a few dozen 16 x 16
examples, the fc layers of a small CNN)."""

import json
import os
import sys
import threading

import numpy as np
import pytest

from gsd_cli import GSDError
from gsd_cli.ranking.cache import SubspaceCache
from gsd_cli.ranking.catalog import run_catalog, run_jobs
from gsd_cli.cli import main
from gsd_cli.ranking import get_executor, rank
from gsd_cli.ranking.executors import DriverTurns, in_turns
from gsd_cli.ranking.ray_executor import FAIL_ONCE_ENV, RayExecutor

KW = dict(examples=30, k=3, model="fmnist-cnn", params="fc*", engine="vmap", device="cpu", labels="own")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray instance for the module; the fail-once hook's folder is set before it starts (its
    workers inherit the environment)."""
    ray = pytest.importorskip("ray")
    arms = tmp_path_factory.mktemp("fail-once")
    saved = os.environ.get(FAIL_ONCE_ENV)
    os.environ[FAIL_ONCE_ENV] = str(arms)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")

    @ray.remote
    def warm():
        import gsd_cli.ranking  # noqa: F401  (the workers import torch and gsd_cli once, here)

        return os.getpid()

    ray.get([warm.remote() for _ in range(2)])
    yield arms
    ray.shutdown()
    if saved is None:
        os.environ.pop(FAIL_ONCE_ENV, None)
    else:
        os.environ[FAIL_ONCE_ENV] = saved


@pytest.fixture
def sets(tmp_path):
    """A private set with a name no public payload may contain, and three public candidates."""
    rng = np.random.default_rng(5)
    base = rng.uniform(size=(4, 16, 16))
    out = {}
    for name, shift, seed in (("secretpriv", 0.0, 1), ("near", 0.0, 2), ("mid", 0.5, 3), ("far", 1.0, 4)):
        r = np.random.default_rng(seed)
        y = r.integers(0, 4, 40)
        x = np.clip(base[y] * (1 - shift) + shift * r.uniform(size=(40, 16, 16)) + 0.05 * r.normal(size=(40, 16, 16)), 0, 1)
        np.savez(tmp_path / f"{name}.npz", x=(x * 255).astype(np.uint8), y=y, classes=np.array(list("abcd")))
        out[name] = f"npz:{tmp_path / name}.npz"
    return out


def _pairs(ranking):
    return {r.public: r.distance for r in ranking}


def _same(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == pytest.approx(b[name], rel=1e-9, abs=1e-12)


def _spy(executor):
    """Record what each task is given (its arguments, object references resolved)."""
    import ray

    sent = []
    submit = executor._submit

    def spy(args, options):
        sent.append(tuple(ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args))
        return submit(args, options)

    executor._submit = spy
    return sent


def test_ray_gives_the_local_ranking(cluster, sets):
    pubs = [sets["near"], sets["mid"], sets["far"]]
    ex = RayExecutor()
    got = rank(sets["secretpriv"], pubs, executor=ex, **KW)
    assert ex.submitted == 3 and not ex.started  # the module's Ray instance was joined, not started
    _same(_pairs(got), _pairs(rank(sets["secretpriv"], pubs, **KW)))
    assert got[0].public == sets["near"]


def test_a_catalogue_on_ray_equals_the_local_run(cluster, sets, tmp_path):
    text = "".join(f'[datasets.{n}]\nsource = "npz"\npath = "{s[4:]}"\n' for n, s in sets.items())
    for private, cands in (("secretpriv", ["near", "mid", "far"]), ("near", ["mid", "far"])):
        text += f'[[jobs]]\nprivate = "{private}"\ncandidates = {json.dumps(cands)}\n[jobs.options]\n'
        text += "".join(f"{k} = {json.dumps(v)}\n" for k, v in KW.items())
    cat = tmp_path / "gsd.toml"
    cat.write_text(text)
    order = []
    ex = RayExecutor(jobs_in_flight=2)
    ran = run_jobs(cat, executor=ex, on_job=lambda run: order.append(len(run.results)))
    assert order == [1, 2] and not ran.errors and ex.submitted == 5  # both jobs, reported in job order
    local = run_catalog(cat)
    for (job, a), (_, b) in zip(ran.results, local):
        assert a.private == b.private == job.private
        _same(_pairs(a), _pairs(b))


def test_cached_candidates_schedule_no_task(cluster, sets, tmp_path):
    cache = SubspaceCache(tmp_path / "cache")
    first = rank(sets["secretpriv"], [sets["near"]], cache=cache, **KW)  # local: caches near
    ex = RayExecutor()
    sent = _spy(ex)
    both = rank(sets["secretpriv"], [sets["near"], sets["far"]], cache=cache, executor=ex, **KW)
    assert [s[1].name for s in sent] == [sets["far"]] and ex.submitted == 1  # near came from the cache
    assert _pairs(both)[sets["near"]] == pytest.approx(_pairs(first)[sets["near"]], abs=1e-6)  # (cached bases are float32)
    rank(sets["secretpriv"], [sets["near"], sets["far"]], cache=cache, executor=ex, **KW)
    assert ex.submitted == 1  # far was written to the cache after its task: nothing scheduled


def test_nothing_private_is_sent(cluster, sets):
    import ray

    from gsd_cli import data as gdata

    priv = gdata.resolve(sets["secretpriv"])
    private_bytes = priv._x[:8].tobytes()  # 2 KiB of the private images, as the source holds them
    for extra in ({}, {"dp": True, "epsilon": 1.0, "insecure_seed": 987654321}):
        ex = RayExecutor()
        sent = _spy(ex)
        rank(priv, [sets["near"], sets["far"]], executor=ex, **KW, **extra)
        assert len(sent) == 2
        for recipe, source, indices, seed in sent:
            blob = ray.cloudpickle.dumps((recipe, source, indices, seed))
            assert source.name in (sets["near"], sets["far"]) and source.name.encode() in blob  # the scan sees names
            assert b"secretpriv" not in blob and private_bytes not in blob
            assert b"PCG64" not in blob  # no generator: DP-GSD's secret one stays in the driver
            assert recipe.config.privacy.insecure_seed is None  # nor the seed that would reproduce it


def test_without_ray_the_error_says_how_to_install(monkeypatch, sets, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails, as when it is not installed
    with pytest.raises(GSDError, match=r"pip install 'gsd-cli\[ray\]'"):
        get_executor("ray")
    assert main(["rank", "--private", sets["secretpriv"], "--public", sets["near"], "-q", "--executor", "ray"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'gsd-cli[ray]'" in err and "Traceback" not in err


def test_overlapping_jobs_take_turns_in_the_driver():
    """Jobs overlap only while they wait on remote work; their driver work never runs at once."""
    turns, log, inside = DriverTurns(), [], []
    ran = {j: threading.Event() for j in range(3)}

    class Remote:
        jobs_in_flight = 3

    Remote.turns = turns

    def driver_work(job, what):
        inside.append(job)
        assert len(inside) == 1, f"driver work of jobs {inside} at once"
        log.append((what, job))
        inside.remove(job)

    def attempt(job):
        driver_work(job, "private")
        ran[job].set()
        with turns.waiting():  # the cluster computes this job's public sides
            if job == 0:
                assert ran[1].wait(30) and ran[2].wait(30)  # the other jobs' driver work ran meanwhile
        driver_work(job, "compare")
        return job

    assert list(in_turns([0, 1, 2], attempt, Remote())) == [0, 1, 2]
    assert log.index(("private", 2)) < log.index(("compare", 0))
    log.clear()
    assert list(in_turns([0, 1], lambda j: driver_work(j, "only") or j, object())) == [0, 1]  # no overlap: in order
    assert log == [("only", 0), ("only", 1)]


def test_a_failed_job_stops_the_overlapping_ones():
    stops = []

    class Remote:
        jobs_in_flight = 2
        turns = DriverTurns()

        def stop(self):
            stops.append(True)

    def attempt(job):
        if job == 0:
            raise GSDError("job 0 failed")
        return job

    with pytest.raises(GSDError, match="job 0 failed"):
        list(in_turns([0, 1, 2], attempt, Remote()))
    assert stops == [True]


def test_cli_executor_options(cluster, sets, tmp_path, capsys):
    args = ["rank", "--private", sets["secretpriv"], "--public", sets["near"], sets["far"], "-q", "-k", "3", "-m", "30",
            "--model", "fmnist-cnn", "--params", "fc*", "--engine", "vmap", "--labels", "own", "--no-cache"]
    assert main([*args, "--executor", "ray", "--json", str(tmp_path / "ray.json")]) == 0
    assert main([*args, "--json", str(tmp_path / "local.json")]) == 0
    dist = {p: {r["public"]: r["distance"] for r in json.loads((tmp_path / p).read_text())["results"]} for p in ("ray.json", "local.json")}
    _same(dist["ray.json"], dist["local.json"])
    assert main([*args, "--ray-address", "auto"]) == 2
    assert "--ray-address is only used with --executor ray" in capsys.readouterr().err
    assert main([*args, "--executor", "spark"]) == 2
    assert "unknown executor 'spark'" in capsys.readouterr().err


def test_workers_keep_their_model_and_few_tasks_are_in_flight(cluster, sets, tmp_path):
    """Issue 37: one model per worker process (not one per task), at most ``tasks_in_flight`` tasks
    submitted and not yet handed on, and nothing left in the object store by the run."""
    rng = np.random.default_rng(9)
    pubs = []
    for i in range(6):
        np.savez(tmp_path / f"extra{i}.npz", x=rng.integers(0, 256, (40, 16, 16), dtype=np.uint8), y=rng.integers(0, 4, 40))
        pubs.append(f"npz:{tmp_path / f'extra{i}.npz'}")
    kw = {**KW, "seed": 11}  # a model no worker has built yet
    ex = RayExecutor(tasks_in_flight=2)
    got = rank(sets["secretpriv"], pubs, executor=ex, **kw)
    assert ex.submitted == 6 and ex.most_in_flight == 2 and not ex._refs
    assert set(ex.models_built.values()) == {1} and len(ex.models_built) < 6  # each worker built it once, and kept it
    _same(_pairs(got), _pairs(rank(sets["secretpriv"], pubs, **kw)))
    ex.connect()
    assert RayExecutor()._window(ex._options("cpu")) == 4  # by default twice the tasks the 2 CPUs run at once


# the two tests that kill workers come last: the replacements start (and import torch) only if needed


def test_a_worker_that_dies_is_retried(cluster, sets):
    arm = cluster / "mid.npz"
    arm.write_text("die once")
    ex = RayExecutor(max_retries=2)
    got = rank(sets["secretpriv"], [sets["near"], sets["mid"]], executor=ex, **KW)
    assert not arm.exists()  # the hook fired: a worker exited in the middle of mid's task
    _same(_pairs(got), _pairs(rank(sets["secretpriv"], [sets["near"], sets["mid"]], **KW)))


def test_a_dead_worker_without_retries_is_a_one_line_error(cluster, sets):
    (cluster / "far.npz").write_text("die once")
    with pytest.raises(GSDError, match=r"public candidate \S*far.npz: its Ray worker died 1 time"):
        rank(sets["secretpriv"], [sets["far"]], executor=RayExecutor(max_retries=0), **KW)
