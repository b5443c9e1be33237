"""A sweep of bad inputs (issue 19): every option of every command and every loader, each case one
``error:`` line on stderr (``check failed:`` for a failed check), no traceback, and its exit code (2 bad
usage or input, 1 a failed check). Tiny inputs; each case fails before the heavy work."""

import csv
import importlib.util

import numpy as np
import pytest
from PIL import Image

from gsd_cli.cli import main

from test_outputs import bomb_png

R = ["rank", "-m", "20", "-k", "2", "--model", "fmnist-cnn", "--params", "fc*", "-q"]
RP = [*R, "--public", "mnist-b"]
T = ["train", "--method", "dpsgd", "--epochs", "1", "--batch-size", "30", "--model", "fmnist-cnn", "-q"]
C = ["compare", "--methods", "dpsgd", "--seeds", "1", "--epochs", "1", "-q"]
HAS_HF = importlib.util.find_spec("datasets") is not None


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    """Every bad (and a few good) inputs the cases name as {d}/..."""
    root = tmp_path_factory.mktemp("bad")
    rng = np.random.default_rng(0)
    x = (rng.uniform(size=(30, 16, 16)) * 255).astype(np.uint8)
    np.savez(root / "ok.npz", x=x, y=np.arange(30) % 3, classes=np.array(["a", "b", "c"]))
    xn = x.astype(np.float32) / 255
    xn[0, 0, 0] = np.nan
    np.savez(root / "nan.npz", x=xn, y=np.arange(30) % 3)
    np.savez(root / "noy.npz", x=x)
    np.savez(root / "flat.npz", x=np.zeros(30), y=np.zeros(30))
    np.savez(root / "short.npz", x=x, y=np.arange(10) % 3)
    (root / "text.npz").write_text("not a zip")
    (root / "empty").mkdir()
    for name, classes in [("folder", ["cats", "dogs"]), ("oneclass", ["cats"]), ("badimg", ["cats", "dogs"]),
                          ("bomb", ["cats", "dogs"])]:
        for c in classes:
            (root / name / c).mkdir(parents=True)
            for i in range(4):
                Image.fromarray((rng.uniform(size=(12, 12)) * 255).astype(np.uint8)).save(root / name / c / f"{i}.png")
    (root / "badimg" / "cats" / "0.png").write_text("not a png")
    bomb_png(root / "bomb" / "cats" / "0.png")
    imgs = sorted((root / "folder").rglob("*.png"))

    def write_csv(name, header, rows):
        with open(root / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)

    write_csv("nolabel.csv", ["path", "comment"], [[str(p), "x"] for p in imgs])
    write_csv("missing.csv", ["path", "label"], [[str(root / "nowhere" / f"{i}.png"), i % 2] for i in range(8)])
    write_csv("emptylabel.csv", ["path", "label"], [[str(p), "" if i == 2 else i % 2] for i, p in enumerate(imgs)])
    write_csv("nopath.csv", ["label"], [[i % 2] for i in range(8)])
    (root / "empty.csv").write_text("")
    (root / "bad.toml").write_text("this is = = not toml")
    (root / "nojobs.toml").write_text("[datasets]\n")
    (root / "afile").write_text("a file")
    (root / "full").mkdir()
    (root / "full" / "something").write_text("x")
    return root


CASES = [
    # gsd rank: every option
    ("rank-private-unknown", [*RP, "--private", "no-such-set"], 2),
    ("rank-public-unknown", [*R, "--public", "no-such-set"], 2),
    ("rank-k-zero", [*RP, "-k", "0"], 2),
    ("rank-k-text", [*RP, "-k", "abc"], 2),
    ("rank-k-too-large", [*RP, "-k", "50"], 2),
    ("rank-m-one", [*RP, "-m", "1"], 2),
    ("rank-m-negative", [*RP, "-m", "-3"], 2),
    ("rank-seed-negative", [*RP, "--seed", "-5"], 2),
    ("rank-seed-text", [*RP, "--seed", "x"], 2),
    ("rank-insecure-seed-without-dp", [*RP, "--insecure-seed", "3"], 2),
    ("rank-insecure-seed-negative", [*RP, "--dp", "--epsilon", "1", "--insecure-seed", "-1"], 2),
    ("rank-classes-zero", [*R, "--private", "npz:{d}/nan.npz", "--public", "mnist-b", "--classes", "0"], 2),
    ("rank-model-unknown", [*RP, "--model", "no-such-model"], 2),
    ("rank-params-no-match", [*RP, "--params", "zzz*"], 2),
    ("rank-weights-missing", [*RP, "--weights", "{d}/none.safetensors"], 2),
    ("rank-weights-not-weights", [*RP, "--weights", "{d}/afile"], 2),
    ("rank-peft-unknown", [*RP, "--peft", "lora:r=x"], 2),
    ("rank-labels-bad", [*RP, "--labels", "maybe"], 2),
    ("rank-row-norm-bad", [*RP, "--row-norm", "l1"], 2),
    ("rank-device-bad", [*RP, "--device", "tpu"], 2),
    ("rank-chunk-size-zero", [*RP, "--chunk-size", "0"], 2),
    ("rank-engine-bad", [*RP, "--engine", "magic"], 2),
    ("rank-json-no-folder", [*RP, "--json", "{d}/nowhere/r.json"], 2),
    ("rank-json-is-folder", [*RP, "--json", "{d}/empty"], 2),
    ("rank-json-name-too-long", [*RP, "--json", "{d}/" + "j" * 300 + ".json"], 2, "too long"),
    ("rank-json-under-a-file", [*RP, "--json", "{d}/afile/r.json"], 2),
    ("rank-csv-is-folder", [*RP, "--csv", "{d}/empty"], 2),
    ("rank-csv-same-as-json", [*RP, "--json", "{d}/same", "--csv", "{d}/same"], 2, "both write to"),
    ("rank-markdown-no-folder", [*RP, "--markdown", "{d}/nowhere/r.md"], 2),
    ("rank-plot-not-png", [*RP, "--plot", "{d}/r.txt"], 2),
    ("rank-epsilon-without-dp", [*RP, "--epsilon", "1"], 2),
    ("rank-dp-without-epsilon", [*RP, "--dp"], 2),
    ("rank-dp-epsilon-negative", [*RP, "--dp", "--epsilon", "-1"], 2),
    ("rank-dp-clip-zero", [*RP, "--dp", "--epsilon", "1", "--clip", "0"], 2),
    ("rank-dp-mechanism-bad", [*RP, "--dp", "--epsilon", "1", "--mechanism", "laplace"], 2),
    ("rank-dp-gibbs-sweeps-zero", [*RP, "--dp", "--epsilon", "1", "--mechanism", "matrix", "--gibbs-sweeps", "0"], 2),
    ("rank-dp-sketch-below-k", [*RP, "--dp-sketch", "1"], 2),
    ("rank-repeats-zero", [*RP, "--repeats", "0"], 2),
    ("rank-dp-repeats-without-dp", [*RP, "--dp-repeats", "fresh"], 2),
    ("rank-gram-bad", [*RP, "--gram", "sometimes"], 2),
    ("rank-memory-budget-bad", [*RP, "--memory-budget", "lots"], 2),
    ("rank-data-root-builtin-missing", [*R, "--data-root", "{d}/empty", "--private", "cifar10", "--public", "mnist-b"], 2),
    ("rank-catalog-missing", [*R, "--catalog", "{d}/none.toml"], 2),
    ("rank-catalog-not-toml", [*R, "--catalog", "{d}/bad.toml"], 2),
    ("rank-catalog-with-public", [*RP, "--catalog", "{d}/nojobs.toml"], 2),
    ("rank-fail-above-nan", [*RP, "--fail-above", "nan"], 2),
    ("rank-fail-above-negative", [*RP, "--fail-above", "-1"], 2),
    ("rank-expect-best-not-a-candidate", [*RP, "--expect-best", "mnist-c"], 2, "not a candidate"),
    ("rank-fail-above-fails", [*RP, "--fail-above", "0"], 1),
    ("rank-expect-best-fails", [*R, "--public", "mnist-b", "noise", "--expect-best", "noise"], 1),
    ("rank-unknown-option", [*RP, "--no-such-option"], 2),
    ("rank-extra-argument", [*R, "mnist-b"], 2),
    ("rank-public-twice", [*R, "--public", "mnist-b", "mnist-b"], 2),
    # loaders
    ("folder-missing", [*R, "--private", "folder:{d}/nowhere", "--public", "mnist-b"], 2),
    ("folder-empty", [*R, "--private", "folder:{d}/empty", "--public", "mnist-b"], 2),
    ("folder-one-class", [*R, "--private", "folder:{d}/oneclass", "--public", "mnist-b"], 2, "one class"),
    ("folder-unreadable-image", [*R, "--private", "folder:{d}/badimg", "--public", "mnist-b"], 2),
    ("folder-decompression-bomb", [*R, "--private", "folder:{d}/bomb", "--public", "mnist-b"], 2, "too large"),
    ("folder-is-a-file", [*R, "--private", "folder:{d}/afile", "--public", "mnist-b"], 2),
    ("npz-missing", [*R, "--private", "npz:{d}/none.npz", "--public", "mnist-b"], 2),
    ("npz-not-a-zip", [*R, "--private", "npz:{d}/text.npz", "--public", "mnist-b"], 2),
    ("npz-without-y", [*R, "--private", "npz:{d}/noy.npz", "--public", "mnist-b"], 2),
    ("npz-nan-pixels", [*R, "--private", "npz:{d}/nan.npz", "--public", "mnist-b"], 2, "NaN"),
    ("npz-one-dimensional", [*R, "--private", "npz:{d}/flat.npz", "--public", "mnist-b"], 2),
    ("npz-x-y-lengths-differ", [*R, "--private", "npz:{d}/short.npz", "--public", "mnist-b"], 2),
    ("npz-public-nan", [*R, "--public", "npz:{d}/nan.npz"], 2),
    ("csv-missing", [*R, "--private", "csv:{d}/none.csv", "--public", "mnist-b"], 2),
    ("csv-empty", [*R, "--private", "csv:{d}/empty.csv", "--public", "mnist-b"], 2),
    ("csv-no-label-column", [*R, "--private", "csv:{d}/nolabel.csv", "--public", "mnist-b"], 2),
    ("csv-no-path-column", [*R, "--private", "csv:{d}/nopath.csv", "--public", "mnist-b"], 2),
    ("csv-images-missing", [*R, "--private", "csv:{d}/missing.csv", "--public", "mnist-b"], 2),
    ("csv-empty-label-cell", [*R, "--private", "csv:{d}/emptylabel.csv", "--public", "mnist-b"], 2, "empty label"),
    ("hf-missing", [*R, "--private", "hf:{d}/nowhere", "--public", "mnist-b"], 2),
    ("embedded-bad-split", [*R, "--private", "mnist-a:validation", "--public", "mnist-b"], 2),
    ("kind-unknown", [*R, "--private", "zip:{d}/x.zip", "--public", "mnist-b"], 2),
    ("builtin-missing", [*R, "--data-root", "{d}/empty", "--private", "mnist-a", "--public", "cifar10"], 2),
    # gsd train
    ("train-epsilon-zero", [*T, "--epsilon", "0"], 2),
    ("train-delta-one", [*T, "--delta", "1"], 2),
    ("train-method-unknown", [*T, "--method", "sgd"], 2),
    ("train-epochs-zero", [*T, "--epochs", "0"], 2),
    ("train-batch-size-zero", [*T, "--batch-size", "0"], 2),
    ("train-seed-negative", [*T, "--seed", "-5"], 2),
    ("train-out-is-a-file", [*T, "--out", "{d}/afile"], 2),
    ("train-out-not-empty", [*T, "--out", "{d}/full"], 2),
    ("train-resume-missing", [*T, "--resume", "{d}/nowhere"], 2),
    ("train-resume-not-a-run", [*T, "--resume", "{d}/empty"], 2, "no gsd run"),
    ("train-resume-and-out", [*T, "--resume", "{d}/empty", "--out", "{d}/new"], 2),
    ("train-model-unknown", [*T, "--model", "no-such-model"], 2),
    ("train-gep-two-publics", [*T, "--method", "gep", "--public", "mnist-b", "noise"], 2),
    ("train-sparsify-above-one", [*T, "--sparsify", "1.5"], 2),
    ("train-topk-fraction-zero", [*T, "--method", "topagg", "--topk-fraction", "0"], 2),
    ("train-private-unknown", [*T, "--private", "no-such-set"], 2),
    ("train-clip-zero", [*T, "--clip", "0"], 2),
    ("train-accountant-bad", [*T, "--accountant", "zcdp"], 2),
    # gsd compare
    ("compare-method-unknown", [*C, "--methods", "sgd"], 2),
    ("compare-seeds-zero", [*C, "--seeds", "0"], 2),
    ("compare-epsilon-negative", [*C, "--epsilon", "-1"], 2),
    ("compare-out-not-empty", [*C, "--out", "{d}/full"], 2),
    ("compare-seed-negative", [*C, "--seed", "-2"], 2),
    # gsd datasets, models, cache
    ("datasets-show-unknown", ["datasets", "show", "no-such-set"], 2),
    ("datasets-show-npz-missing", ["datasets", "show", "npz:{d}/none.npz"], 2),
    ("datasets-unknown-subcommand", ["datasets", "frob"], 2),
    ("models-show-unknown", ["models", "show", "no-such-model"], 2),
    ("models-show-peft-bad", ["models", "show", "fmnist-cnn", "--peft", "lora:r=x"], 2),
    ("models-show-json-no-folder", ["models", "show", "fmnist-cnn", "--json", "{d}/nowhere/m.json"], 2),
    ("models-show-classes-zero", ["models", "show", "fmnist-cnn", "--classes", "0"], 2),
    ("cache-unknown-subcommand", ["cache", "frob"], 2),
    ("cache-info-extra-argument", ["cache", "info", "extra"], 2, "gsd cache info --help"),
    ("global-unknown-command", ["rankk"], 2),
]

# Cases that belong to a colleague's part of issue 19 and may not pass yet (strict=False).
PENDING: dict[str, str] = {}
if not HAS_HF:
    PENDING["hf-missing"] = "the datasets package is not installed"


CASES = [(*c, None) if len(c) == 3 else c for c in CASES]  # (name, argv, exit code, text the line must hold)


@pytest.mark.parametrize("name,argv,code,needle", CASES, ids=[c[0] for c in CASES])
def test_bad_input(capsys, d, name, argv, code, needle, request):
    if name in PENDING:
        request.applymarker(pytest.mark.xfail(reason=PENDING[name], strict=False))
    got = main([a.format(d=d) for a in argv])
    _, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert got == code, err
    start = "check failed:" if code == 1 else "error:"
    assert len(lines) == 1 and lines[0].startswith(start), err
    assert needle is None or needle in lines[0], lines[0]


def test_the_sweep_is_large_enough():
    assert len(CASES) >= 60
