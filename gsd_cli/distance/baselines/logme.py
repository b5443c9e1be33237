"""LogME (You, Liu, Wang, Long, ICML 2021), a transferability score, turned into a dataset measure:
how well do features *learned on the public set* serve the *private* labels?

For each candidate, a copy of the ranking's model at w0 is trained on the public sample with the
public set's own labels (a new head sized to them; Adam, :data:`EPOCHS` epochs, batch
:data:`BATCH`, learning rate :data:`LR`; public data only). The penultimate features of the private
sample under those weights and the private labels then give LogME: for each class, the log evidence
of a Bayesian linear regression of the one-hot label column on the features,

    L(alpha, beta) = n/2 log beta + D/2 log alpha - n/2 log 2pi - beta/2 ||F m - y||^2
                     - alpha/2 m^T m - 1/2 log |alpha I + beta F^T F|,   m = beta A^-1 F^T y,

maximised over (alpha, beta) by the paper's fixed-point iteration (Algorithm 1), divided by n and
averaged over the classes. Higher LogME means better transfer, so the ranking's value is **-LogME**
(lower is better, as every metric of ``gsd rank``).
Privately: no (it fits the private labels on the private features; no DP version here).
"""

from __future__ import annotations

import copy
import time

import numpy as np
import torch
import torch.nn as nn

from ... import data as gdata
from ...gradients import default_loss
from ..registry import SideContext, register_distance
from .features import BaselineDistance, Features, engine_of, own_labels, sample_features

EPOCHS, BATCH, LR = 3, 64, 1e-3


def log_evidence(F: np.ndarray, y: np.ndarray, alpha: float, beta: float) -> float:
    """L(alpha, beta) computed directly (dense matrices): for tests and as the definition."""
    F, y = np.asarray(F, np.float64), np.asarray(y, np.float64)
    n, D = F.shape
    A = alpha * np.eye(D) + beta * F.T @ F
    m = beta * np.linalg.solve(A, F.T @ y)
    _, logdet = np.linalg.slogdet(A)
    return float(n / 2 * np.log(beta) + D / 2 * np.log(alpha) - n / 2 * np.log(2 * np.pi)
                 - beta / 2 * np.sum((F @ m - y) ** 2) - alpha / 2 * m @ m - logdet / 2)


def logme(F, labels, iters: int = 100, tol: float = 1e-5) -> float:
    """LogME of features ``F`` (n x D) for single-label ``labels``: mean over classes of the maximised
    log evidence per example (You et al. 2021, Algorithm 1, in the SVD basis of F)."""
    F = np.asarray(F, np.float64)
    labels = np.asarray(labels)
    n, D = F.shape
    U, s, _ = np.linalg.svd(F, full_matrices=False)
    sig = s**2
    r = len(s)
    out = []
    for c in np.unique(labels):
        y = (labels == c).astype(np.float64)
        z = U.T @ y
        rest = max(float(y @ y - z @ z), 0.0)  # ||y||^2 outside the span of F
        alpha, beta = 1.0, 1.0
        for _ in range(iters):
            t = beta * sig / (alpha + beta * sig)
            gamma = float(t.sum())
            mt = beta * s * z / (alpha + beta * sig)  # m in the right-singular basis
            mm = float(mt @ mt)
            res = float(np.sum((s * mt - z) ** 2)) + rest
            # floored: degenerate features (gamma -> 0, e.g. a candidate whose features are all equal)
            # would drive alpha to 0 and divide by it below
            a_new, b_new = max(gamma / max(mm, 1e-300), 1e-300), max((n - gamma) / max(res, 1e-300), 1e-300)
            done = abs(a_new - alpha) / alpha < tol and abs(b_new - beta) / beta < tol
            alpha, beta = a_new, b_new
            if done:
                break
        mt = beta * s * z / (alpha + beta * sig)
        res = float(np.sum((s * mt - z) ** 2)) + rest
        logdet = float(np.sum(np.log(alpha + beta * sig))) + (D - r) * np.log(alpha)
        L = (n / 2 * np.log(beta) + D / 2 * np.log(alpha) - n / 2 * np.log(2 * np.pi)
             - beta / 2 * res - alpha / 2 * float(mt @ mt) - logdet / 2)
        out.append(L / n)
    return float(np.mean(out))


def train_on_public(model: nn.Module, sample: gdata.Sample, common: dict, seed: int) -> dict:
    """A copy of ``model`` trained on the public ``sample`` (own labels, a new head); its state
    without the head."""
    from ...models.weights import head_prefix

    dev = common.get("device") or torch.device("cpu")
    net = copy.deepcopy(model).to(dev)
    head = head_prefix(net)
    y_all = torch.from_numpy(own_labels(sample))
    old = net.get_submodule(head)
    width = max(int(y_all.max()) + 1 if len(y_all) else 1, sample.source.num_classes, 2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 7349)
        new = nn.Linear(old.in_features, width).to(dev)
    parent, _, child = head.rpartition(".")
    setattr(net.get_submodule(parent) if parent else net, child, new)
    names = set(common["names"])
    params = [p for n, p in net.named_parameters() if n in names and not n.startswith(head + ".")] + list(new.parameters())
    for p in net.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=LR)
    x_all = sample.tensor(common["input_size"], common["channels"], "cpu")
    net.train()
    for epoch in range(EPOCHS):
        order = np.random.default_rng([seed, 0x10A3E, epoch]).permutation(len(sample))
        for start in range(0, len(order), BATCH):
            part = torch.from_numpy(order[start : start + BATCH])
            loss = default_loss(net(x_all[part].to(dev)), y_all[part].to(dev)).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return {k: v.detach().cpu().clone() for k, v in net.state_dict().items() if not k.startswith(head + ".")}


@register_distance("logme")
class LogME(BaselineDistance):
    """-LogME of the private labels on features of the model trained on each public set."""

    reading = "-LogME: private labels on features of the model trained briefly on each public set; lower is better"
    privately = "no (fits the private labels on private features)"

    def private_side(self, ctx: SideContext, sample: gdata.Sample) -> Features:
        return Features(sample.source.name, torch.empty(0, 0), torch.empty(0), len(sample), 0.0, engine_of(ctx),
                        labels=own_labels(sample), extra={"model": ctx.model, "sample": sample, "common": ctx.common})

    def public_side(self, ctx: SideContext, sample: gdata.Sample, seed: int) -> Features:
        t0 = time.perf_counter()
        state = train_on_public(ctx.model, sample, ctx.common, seed)
        return Features(sample.source.name, torch.empty(0, 0), torch.empty(0), len(sample), time.perf_counter() - t0,
                        engine_of(ctx), extra={"state": state})

    def value(self, private: Features, public: Features) -> float:
        net = copy.deepcopy(private.extra["model"])
        net.load_state_dict(public.extra["state"], strict=False)
        feats = sample_features(net, private.extra["sample"], private.extra["common"])
        return -logme(feats.numpy(), private.labels)
