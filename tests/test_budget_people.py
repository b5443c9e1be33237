"""A budget that follows the people (issue 43, section 2): the ledger keys a data set by its examples'
decoded content, so the same images as a PNG folder, a copy with one pixel changed by one grey level
and a set grown by one example are all charged against the budget of the set they share examples
with; an old ledger (one content digest per set) is upgraded in place; `budget show --publishable`
prints its table; a training's size estimate is booked before it is drawn."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
from PIL import Image

from gsd_cli import data as gdata
from gsd_cli.cli import main
from gsd_cli.errors import GSDError
from gsd_cli.privacy import budget as B

CLASSES = np.array(["a", "b", "c"])


def _images(n=24, seed=0, size=8):
    rng = np.random.default_rng(seed)
    return (rng.uniform(size=(n, size, size)) * 255).astype(np.uint8), rng.integers(0, 3, n)


def _npz(path, x, y):
    np.savez(path, x=x, y=y, classes=CLASSES)
    return f"npz:{path}"


def _folder(root, x, y, names=("a", "b", "c"), mode="L"):
    """The same images as PNG files, one sub-folder per class (``names``: the folders, so the class order may differ)."""
    for c in names:
        (root / c).mkdir(parents=True, exist_ok=True)
    for i, (img, label) in enumerate(zip(x, y)):
        arr = img if mode == "L" else np.repeat(img[..., None], 3, axis=-1)
        Image.fromarray(arr, mode=mode).save(root / names[int(label)] / f"img{i:03d}.png")
    return f"folder:{root}"


def _book(led, data, eps=1.0):
    return led.book(B.data_identity(data), what="DP-GSD ranking", mechanism="m", epsilon=eps, delta=0.0, rdp=B.pure_dp_curve(eps))


# --- one identity per example, whatever the storage -------------------------------------------------

def test_example_identity_ignores_format_dtype_layout_order_path_and_label(tmp_path):
    x, y = _images()
    ref = B.data_identity(_npz(tmp_path / "ref.npz", x, y))
    assert ref.how == "examples" and ref.size == 24 and len(ref.examples) == 24
    same = {
        "float npz": _npz(tmp_path / "f.npz", x.astype(np.float64) / 255.0, y),
        "N x H x W x 1": _npz(tmp_path / "c1.npz", x[..., None], y),
        "reversed order, other labels": _npz(tmp_path / "rev.npz", x[::-1].copy(), (y[::-1] + 1) % 3),
        "grey PNG folder": _folder(tmp_path / "png", x, y),
        "RGB PNG folder, other class order": _folder(tmp_path / "rgb", x, y, names=("c", "a", "b"), mode="RGB"),
    }
    for what, spec in same.items():
        assert B.data_identity(spec).digest == ref.digest, what
    # 16-bit PNG of the same values (v * 257): the same 8-bit image
    (tmp_path / "p16" / "a").mkdir(parents=True)
    for i, img in enumerate(x[:3]):
        Image.fromarray(img.astype(np.uint16) * 257).save(tmp_path / "p16" / "a" / f"{i}.png")
    (tmp_path / "p16" / "b").mkdir()
    Image.fromarray(x[3]).save(tmp_path / "p16" / "b" / "3.png")
    assert set(B.data_identity(f"folder:{tmp_path / 'p16'}").examples) == set(B.example_digest(im / 255.0) for im in x[:4])
    # one grey level in one pixel is another example; every other example is the same
    x1 = x.copy()
    x1[5, 3, 4] = x1[5, 3, 4] + 1 if x1[5, 3, 4] < 255 else 254
    one = B.data_identity(_npz(tmp_path / "one.npz", x1, y))
    assert one.digest != ref.digest and len(set(one.examples) & set(ref.examples)) == 23
    # a colour image is not its grey version unless its three channels are equal
    rgb = np.stack([x[0], x[0], 255 - x[0]], axis=-1) / 255.0
    assert B.example_digest(rgb) != B.example_digest(x[0] / 255.0)
    assert B.example_digest(np.repeat(x[0][..., None], 3, axis=-1) / 255.0) == B.example_digest(x[0] / 255.0)


def test_png_folder_copy_is_refused_past_the_npz_budget(tmp_path):
    """Budget 1.5, epsilon 1 spent on the npz: the same images as a PNG folder are the same people."""
    x, y = _images()
    npz = _npz(tmp_path / "x.npz", x, y)
    folder = _folder(tmp_path / "png", x, y, names=("b", "c", "a"))
    led = B.BudgetLedger(tmp_path / "l.sqlite")
    led.set_budget(B.data_identity(npz), 1.5, 1e-5)
    _book(led, npz)
    with pytest.raises(B.BudgetExceeded, match="privacy budget exceeded"):
        _book(led, folder)
    s = led.status()
    assert len(s) == 1 and len(s[0]["runs"]) == 1, "one data set, whatever its storage"


def test_one_pixel_copy_and_a_grown_set_share_the_others_and_are_refused(tmp_path):
    x, y = _images()
    npz = _npz(tmp_path / "x.npz", x, y)
    x1 = x.copy()
    x1[7, 0, 0] = x1[7, 0, 0] ^ 1  # one grey level in one pixel of one image
    pixel = _npz(tmp_path / "pixel.npz", x1, y)
    grown = _npz(tmp_path / "grown.npz", np.concatenate([x, _images(1, seed=9)[0]]), np.concatenate([y, [0]]))
    led = B.BudgetLedger(tmp_path / "l.sqlite")
    led.set_budget(B.data_identity(npz), 1.5, 1e-5)
    _book(led, npz)
    for copy in (pixel, grown):
        with pytest.raises(B.BudgetExceeded, match=r"shares examples with npz:.*x\.npz.*budget exceeded"):
            _book(led, copy)
    # within the budget, a run on the copy is booked against the original's budget (and said so)
    b = _book(led, pixel, eps=0.25)
    assert b["charged"] == [{"name": npz, "self": False, "remaining": pytest.approx(b["charged"][0]["remaining"])}]
    assert b["charged"][0]["remaining"]["epsilon"] == pytest.approx(0.25)
    assert B.booked_line(b, "npz:pixel.npz", led) == f"booked epsilon 0.25 on npz:pixel.npz in {led.location}"  # public
    assert B.left_line(b) == f"0.25 epsilon left of the budget of {npz}, which shares examples with it"  # a private line
    original = next(s for s in led.status() if s["name"] == npz)
    assert [r["shared"] for r in original["runs"]] == [False, True] and original["remaining"]["epsilon"] == pytest.approx(0.25)
    assert set(original["shares_examples_with"]) == {pixel, grown}  # registered when first seen, refused or not
    # budget show --private of a set the ledger has never seen shows the budgets that apply to it
    x2 = x.copy()
    x2[3] = 255 - x2[3]
    unseen = B.data_identity(_npz(tmp_path / "unseen.npz", x2, y))
    seen = B.BudgetLedger(led.location, create=False).status_of(unseen)
    assert {s["name"] for s in seen} == {npz, pixel, grown} and all(s["shares_with_asked"] for s in seen)
    assert len(led.status()) == 3, "status_of adds nothing"


def test_only_the_sets_sharing_people_are_charged(tmp_path):
    """A (budgeted) and B share an example, B and C share one, A and C share none: a run on C is not
    charged to A; a run on B is."""
    x, y = _images(30)
    a = _npz(tmp_path / "a.npz", x[:10], y[:10])
    b = _npz(tmp_path / "b.npz", x[9:20], y[9:20])
    c = _npz(tmp_path / "c.npz", x[19:30], y[19:30])
    led = B.BudgetLedger(tmp_path / "l.sqlite")
    led.set_budget(B.data_identity(a), 1.0, 1e-5)
    _book(led, c, eps=5.0)
    assert led.status_of(B.data_identity(a))[0]["spent"]["runs"] == 0
    _book(led, b, eps=0.75)
    with pytest.raises(B.BudgetExceeded):
        _book(led, b, eps=0.5)
    _book(led, c, eps=5.0)  # C has no budget and shares no one with A
    assert led.status_of(B.data_identity(a))[0]["spent"]["basic_epsilon"] == pytest.approx(0.75)


def test_storage_scales_and_looks_examples_up_by_their_index(tmp_path):
    rng = np.random.default_rng(1)
    n = 20000
    x = (rng.uniform(size=(n, 4, 4)) * 255).astype(np.uint8)
    big = B.data_identity(_npz(tmp_path / "big.npz", x, np.zeros(n, dtype=int)))
    assert len(big.examples) == len(set(map(bytes, x.reshape(n, -1))))
    led = B.BudgetLedger(tmp_path / "l.sqlite")
    led.set_budget(big, 2.0, 1e-5)
    grown = B.data_identity(_npz(tmp_path / "grown.npz", np.concatenate([x, x[:1] // 2]), np.zeros(n + 1, dtype=int)))
    assert _book(led, grown)["charged"][0]["name"] == big.name
    con = sqlite3.connect(tmp_path / "l.sqlite")
    try:
        rows = con.execute("SELECT COUNT(*) FROM gsd_examples").fetchone()[0]
        plan = " ".join(str(r) for r in con.execute("EXPLAIN QUERY PLAN SELECT sid FROM gsd_examples WHERE example = ?", ("0" * 32,)))
    finally:
        con.close()
    assert rows == len(big.examples) + len(grown.examples)
    assert "gsd_examples_example" in plan, plan


# --- an old ledger --------------------------------------------------------------------------------

_OLD = (
    "CREATE TABLE gsd_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE gsd_datasets (digest TEXT PRIMARY KEY, name TEXT NOT NULL, how TEXT NOT NULL, epsilon DOUBLE PRECISION, "
    "delta DOUBLE PRECISION, created TEXT NOT NULL, updated TEXT NOT NULL, raised INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE gsd_bookings (id TEXT PRIMARY KEY, digest TEXT NOT NULL, name TEXT NOT NULL, time TEXT NOT NULL, what TEXT NOT NULL, "
    "command TEXT NOT NULL, mechanism TEXT NOT NULL, epsilon DOUBLE PRECISION NOT NULL, delta DOUBLE PRECISION NOT NULL, rdp TEXT, "
    "dp INTEGER NOT NULL, guarantee INTEGER NOT NULL)",
)


def _old_ledger(run, digest: str, name: str) -> None:
    """The tables, a budget of 1.5 and one booking of epsilon 1, as gsd 0.3 wrote them (``run(sql, params)``)."""
    for sql in _OLD:
        run(sql, {})
    for k, v in (("schema", "1"), ("orders", json.dumps(B.ORDERS)), ("note", B.PRIVATE_NOTE)):
        run("INSERT INTO gsd_meta (key, value) VALUES (:k, :v)", {"k": k, "v": v})
    t = "2025-01-01T00:00:00+00:00"
    run("INSERT INTO gsd_datasets VALUES (:d, :n, 'arrays', 1.5, 1e-5, :t, :t, 0)", {"d": digest, "n": name, "t": t})
    run("INSERT INTO gsd_bookings VALUES ('old-1', :d, :n, :t, 'DP-GSD ranking', 'gsd rank --dp', 'DP-GSD sequential', 1.0, 0.0, :r, 1, 1)",
        {"d": digest, "n": name, "t": t, "r": json.dumps(B.pure_dp_curve(1.0))})


def _check_upgraded(location, npz, tmp_path, capsys=None):
    led = B.BudgetLedger(location)
    s = led.status()
    assert len(s) == 1 and s[0]["examples"] is None and s[0]["spent"]["basic_epsilon"] == 1.0
    # the old set is found by its old digest: its budget and booking stay; a one-pixel copy is then refused
    with pytest.raises(B.BudgetExceeded):
        _book(led, npz)
    s = led.status()
    assert len(s) == 1 and s[0]["identified_by"] == "examples" and s[0]["examples"] == 24 and len(s[0]["runs"]) == 1
    x = np.load(npz[4:])["x"].copy()
    x[0, 0, 0] ^= 1
    with pytest.raises(B.BudgetExceeded, match="shares examples"):
        _book(led, _npz(tmp_path / "pixel.npz", x, np.load(npz[4:])["y"]))
    assert _book(led, npz, eps=0.5)["charged"][0]["remaining"]["epsilon"] == pytest.approx(0.0)
    led.close()


def test_an_old_ledger_is_upgraded_in_place_and_keeps_its_budgets(tmp_path, capsys):
    x, y = _images()
    npz = _npz(tmp_path / "x.npz", x, y)
    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path)
    _old_ledger(lambda sql, p: con.execute(sql, p), B.legacy_digest(gdata.resolve(npz)), npz)  # the digest gsd 0.3 gave it
    con.commit()
    con.close()
    _check_upgraded(path, npz, tmp_path)
    assert "upgraded the privacy ledger" in capsys.readouterr().err
    # read-only and old: not upgraded behind the user's back, one line
    path2 = tmp_path / "old2.sqlite"
    con = sqlite3.connect(path2)
    _old_ledger(lambda sql, p: con.execute(sql, p), "0" * 64, "other")
    con.commit()
    con.close()
    path2.chmod(0o444)
    try:
        assert main(["budget", "show", "--ledger", str(path2)]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "is unusable: it was written by an older gsd (schema 1) and is read-only" in err
    finally:
        path2.chmod(0o644)


# --- the CLI and the training -----------------------------------------------------------------------

def test_show_publishable_prints_its_table(tmp_path, capsys):
    x, y = _images()
    npz = _npz(tmp_path / "x.npz", x, y)
    assert main(["budget", "set", "--private", npz, "--epsilon", "3", "--delta", "1e-5"]) == 0
    _book(B.BudgetLedger(), npz)
    capsys.readouterr()
    assert main(["budget", "show", "--publishable"]) == 0  # was KeyError 'runs'
    out, err = capsys.readouterr()
    assert "1 run(s)" in out and "basic (adaptive filter)" in out and "gsd rank" not in out and "Traceback" not in err
    assert main(["budget", "show", "--publishable", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["datasets"][0]
    assert doc["runs"] == 1 and "examples" not in doc and "shares_examples_with" not in doc and doc["overspent"] is False


def test_dp_rankings_are_booked_under_their_own_distance(tmp_path):
    from gsd_cli.ranking.config import PrivacySettings

    x, y = _images()
    npz = _npz(tmp_path / "x.npz", x, y)
    led = tmp_path / "l.sqlite"
    matrix = PrivacySettings(dp=True, epsilon=0.5, mechanism="matrix")
    energy = B.book_ranking(npz, matrix, distance="dp-energy", ledger_location=led)
    assert energy["what"] == "DP energy ranking" and energy["guarantee"] and energy["mechanism"].startswith("DP energy distance (Laplace)")
    gibbs = B.book_ranking(npz, matrix, distance="dp-gsd", ledger_location=led)
    assert gibbs["what"] == "DP-GSD ranking" and not gibbs["guarantee"] and "matrix" in gibbs["mechanism"]


def test_the_size_estimate_is_booked_before_it_is_drawn(tmp_path, monkeypatch):
    """Where basic composition cannot admit the whole run before the draw, the estimate is booked
    before it is drawn: a refused training has booked the estimate it drew, and a budget too small for
    the estimate itself refuses the run before anything is drawn. Where it can (or there is no budget),
    admission is decided before the draw and the run is one booking. A declared size books no estimate."""
    from gsd_cli.train import TrainConfig, train
    from gsd_cli.train import size as size_mod

    x, y = _images(90, size=12)
    npz = _npz(tmp_path / "x.npz", x, y)
    cfg = TrainConfig(private=npz, method="dpsgd", epsilon=2.0, epochs=1, batch_size=30, physical_batch=64)
    data = B.data_identity(npz)
    led = B.BudgetLedger()
    draws = []
    real = size_mod.laplace_size
    monkeypatch.setattr(size_mod, "laplace_size", lambda *a, **k: draws.append(1) or real(*a, **k))
    # room for the estimate (0.04) but not for the training: refused, the estimate booked
    led.set_budget(data, 1.0, 1e-5)
    with pytest.raises(B.BudgetExceeded, match="size .*stays booked"):
        train(cfg, tmp_path / "r1")
    runs = led.status()[0]["runs"]
    assert draws == [1] and [(r["what"], r["epsilon"]) for r in runs] == [("training (dpsgd): size estimate", pytest.approx(0.04))]
    # no room for the estimate: refused before it is drawn
    led.set_budget(data, 0.05, 1e-5)
    with pytest.raises(B.BudgetExceeded):
        train(cfg, tmp_path / "r2")
    assert draws == [1] and len(led.status()[0]["runs"]) == 1
    # a data set with room: one booking for the run, the estimate's epsilon inside it
    other = _npz(tmp_path / "y.npz", _images(90, seed=5, size=12)[0], y)
    train(TrainConfig(private=other, method="dpsgd", epsilon=2.0, epochs=1, batch_size=30, physical_batch=64), tmp_path / "r3")
    (entry,) = [s for s in led.status() if s["name"] == other]
    assert [r["what"] for r in entry["runs"]] == ["training (dpsgd)"] and 1.9 < entry["runs"][0]["epsilon"] <= 2.0
    assert draws == [1, 1]
    train(TrainConfig(private=other, method="dpsgd", epsilon=2.0, epochs=1, batch_size=30, physical_batch=64, expected_size=90),
          tmp_path / "r4")
    (entry,) = [s for s in led.status() if s["name"] == other]
    assert [r["what"] for r in entry["runs"]] == ["training (dpsgd)"] * 2 and draws == [1, 1]
    # a budget with room for the whole run by basic composition: decided before the draw, one booking
    led.set_budget(B.data_identity(other), 6.0, 1e-4)
    train(TrainConfig(private=other, method="dpsgd", epsilon=2.0, epochs=1, batch_size=30, physical_batch=64), tmp_path / "r5")
    (entry,) = [s for s in led.status() if s["name"] == other]
    assert [r["what"] for r in entry["runs"]] == ["training (dpsgd)"] * 3 and draws == [1, 1, 1]
    assert B.BudgetLedger(led.location, create=False).fits_basic(B.data_identity(other), 2.0, 1e-5) is False  # 3 x ~2 spent


def test_set_budget_bounds(tmp_path):
    led = B.BudgetLedger(tmp_path / "l.sqlite")
    data = B.DataIdentity("a" * 64, "s", "arrays")
    for bad in (1e308, 100.5, float("inf"), float("nan")):
        with pytest.raises(GSDError):
            led.set_budget(data, bad, 1e-5)
    assert led.set_budget(data, B.MAX_BUDGET_EPSILON, 1e-5)["budget"]["epsilon"] == 100.0


def test_examples_and_the_upgrade_on_postgresql(pg_server, tmp_path):
    """The same on a real PostgreSQL (pgserver): a schema-1 ledger upgraded in place, the one-pixel copy refused."""
    import sqlalchemy as sa

    url = pg_server.get_uri()
    x, y = _images()
    npz = _npz(tmp_path / "x.npz", x, y)
    engine = sa.create_engine("postgresql+psycopg://" + url.split("://", 1)[1])
    with engine.begin() as con:
        _old_ledger(lambda sql, p: con.execute(sa.text(sql), p), B.legacy_digest(gdata.resolve(npz)), npz)
    engine.dispose()
    _check_upgraded(url, npz, tmp_path)
