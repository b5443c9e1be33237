"""The disk cache of calibrated noise multipliers (issue 21): a warm hit costs one accountant
evaluation and no calibration; a wrong, corrupted or foreign entry is never trusted (a cached sigma
that would weaken privacy is refused and rewritten); the result is always the fresh calibration's."""

from __future__ import annotations

import json

import pytest

from gsd_cli.privacy import accountant, calibrate_noise, dpsgd_step_event, epsilon_of, gep_step_event, training_event
from gsd_cli.privacy.accountant import RDP_ORDERS, calibration_key
from gsd_cli.privacy.calibration_cache import CalibrationCache, calibration_dir

# a calibration in ~0.01 s (one Gaussian release: q = 1, one step); the subsampled one takes ~0.5 s
SETTING = dict(target_epsilon=1.0, delta=1e-5, sampling_rate=1.0, steps=1)
SUBSAMPLED = dict(target_epsilon=1.0, delta=1e-5, sampling_rate=0.02, steps=1000)


def _opacus_epsilon(q, sigma, steps, delta):
    """An independent accountant: Opacus's RDP analysis of the subsampled Gaussian."""
    from opacus.accountants.analysis import rdp as ordp

    rdp = ordp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(RDP_ORDERS))
    return float(ordp.get_privacy_spent(orders=list(RDP_ORDERS), rdp=rdp, delta=delta)[0])


@pytest.fixture
def counted(monkeypatch):
    """A fresh epsilon memo, and the number of accountants built (one per evaluation)."""
    monkeypatch.setattr(accountant, "_EPSILONS", {})
    built = []
    real = accountant._accountant

    def counting(kind):
        built.append(kind)
        return real(kind)

    monkeypatch.setattr(accountant, "_accountant", counting)
    return built


def _calibrate(make=dpsgd_step_event, **kw):
    s = {**SETTING, **kw}
    return calibrate_noise(make, s["target_epsilon"], s["delta"], s["sampling_rate"], s["steps"], kw.get("accountant", "rdp"))


def _entry_path(make=dpsgd_step_event, setting=SETTING):
    s = setting
    return CalibrationCache().path(calibration_key(make, s["target_epsilon"], s["delta"], s["sampling_rate"], s["steps"], "rdp"))


def test_a_warm_call_is_one_accountant_evaluation_and_the_same_sigma(counted, monkeypatch):
    fresh = calibrate_noise(dpsgd_step_event, 1.0, 1e-5, 0.02, 1000, cache=False)
    assert not calibration_dir().exists()  # cache=False writes nothing
    cold = _calibrate(**SUBSAMPLED)
    assert cold == fresh and _entry_path(setting=SUBSAMPLED).is_file()
    assert _opacus_epsilon(0.02, cold, 1000, 1e-5) <= 1.0 + 1e-3

    def refuse(*a, **k):
        raise AssertionError("calibrated again")

    monkeypatch.setattr(accountant.lazy_dpa.full(), "calibrate_dp_mechanism", refuse)
    monkeypatch.setattr(accountant, "_EPSILONS", {})
    counted.clear()
    assert _calibrate(**SUBSAMPLED) == cold
    assert counted == ["rdp"]  # one evaluation, the check
    # and the trainer's next question (the run's epsilon) is answered from memory
    epsilon_of(training_event(dpsgd_step_event(cold), 0.02, 1000), 1e-5)
    assert counted == ["rdp"]


@pytest.mark.parametrize("factor", [0.5, 0.999, 2.0])
def test_a_wrong_cached_sigma_is_refused_and_rewritten(counted, factor):
    """Too little noise (x0.5, and even 0.1% too little) would break the epsilon target: refused; too
    much (x2) would only cost accuracy: refused as well. The answer is the fresh calibration's, its
    epsilon checked by Opacus's accountant, and the entry is rewritten."""
    right = _calibrate()
    path = _entry_path()
    entry = json.loads(path.read_text())
    entry["sigma"] = right * factor
    path.write_text(json.dumps(entry))
    got = _calibrate()
    assert got == right
    assert _opacus_epsilon(1.0, got, 1, 1e-5) <= 1.0 + 1e-3
    if factor < 1:
        assert epsilon_of(training_event(dpsgd_step_event(right * factor), 1.0, 1), 1e-5) > 1.0  # the trap was real
    assert json.loads(path.read_text())["sigma"] == right


@pytest.mark.parametrize("text", [
    "", "{", "\x00\xff garbage", "[1, 2]", "null",
    '{"schema": 1, "key": {}, "sigma": 1.5}',  # another key
    "SAME_KEY_SIGMA:\"1.5\"", "SAME_KEY_SIGMA:NaN", "SAME_KEY_SIGMA:-2.0", "SAME_KEY_SIGMA:true", "SAME_KEY_SIGMA:Infinity",
])
def test_a_corrupted_entry_is_ignored_and_rewritten(counted, text):
    right = _calibrate()
    path = _entry_path()
    if text.startswith("SAME_KEY_SIGMA:"):
        entry = json.loads(path.read_text())
        text = json.dumps(entry).replace(json.dumps(right), text.split(":", 1)[1])
    path.write_bytes(text.encode("latin-1"))
    assert _calibrate() == right
    assert json.loads(path.read_text())["sigma"] == right


def test_the_key_holds_every_input():
    base = calibration_key(dpsgd_step_event, 1.0, 1e-5, 0.02, 1000, "rdp")
    others = [
        calibration_key(dpsgd_step_event, 1.0 + 1e-12, 1e-5, 0.02, 1000, "rdp"),
        calibration_key(dpsgd_step_event, 1.0, 1.1e-5, 0.02, 1000, "rdp"),
        calibration_key(dpsgd_step_event, 1.0, 1e-5, 0.02 + 1e-15, 1000, "rdp"),
        calibration_key(dpsgd_step_event, 1.0, 1e-5, 0.02, 1001, "rdp"),
        calibration_key(dpsgd_step_event, 1.0, 1e-5, 0.02, 1000, "pld"),
        calibration_key(lambda z: gep_step_event(z, z), 1.0, 1e-5, 0.02, 1000, "rdp"),  # GEP: sigma / sqrt(2)
        calibration_key(lambda z: dpsgd_step_event(2 * z), 1.0, 1e-5, 0.02, 1000, "rdp"),
    ]
    paths = {CalibrationCache().path(k) for k in [base, *others]}
    assert len(paths) == 1 + len(others)
    assert base["dp_accounting"] and base["rdp_orders"]


def test_an_unwritable_cache_costs_nothing_but_time(monkeypatch, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("GSD_CACHE_DIR", str(blocker))
    assert _calibrate() == calibrate_noise(dpsgd_step_event, 1.0, 1e-5, 1.0, 1, cache=False)
    assert blocker.read_text().startswith("a file")


def test_an_explicit_folder(tmp_path):
    sigma = calibrate_noise(dpsgd_step_event, 1.0, 1e-5, 1.0, 1, cache=tmp_path / "cal")
    (entry,) = (tmp_path / "cal").glob("*.json")
    data = json.loads(entry.read_text())
    assert data["sigma"] == sigma and data["epsilon"] <= 1.0 and data["key"]["steps"] == 1
