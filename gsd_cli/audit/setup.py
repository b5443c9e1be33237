"""The audited model and data from names, as ``gsd train`` builds them: a probes model (with
``--weights``/``--peft``), real private training examples beside the canaries, and GEP's public
anchors."""

from __future__ import annotations

import numpy as np

from ..errors import GSDError


def real_setup(cfg, examples: int, insecure_seed: int | None = None, catalog=None):
    """``(model, names, (x, y), public_x)`` for ``cfg.model`` on ``examples`` private training
    examples of ``cfg.private`` (drawn with private randomness), and ``cfg.public_examples`` anchors
    of ``cfg.public`` for GEP (drawn with ``cfg.seed``, public)."""
    import torch
    from .. import data as gdata
    from ..models.spec import resolve_model
    from ..models.peft import build_model
    from ..train.splits import private_parts
    from ..train.config import public_count
    from ..privacy.randomness import private_rng

    resolve_model(cfg.model)  # a bad --model fails before any data is read
    train_src, _ = private_parts(cfg.private, cfg.private_test, catalog)
    if cfg.classes is not None:
        train_src = gdata.with_classes(train_src, cfg.classes)
    gdata.require_declared_classes(train_src)
    if train_src.multilabel:
        raise GSDError("the audit supports single-label private sets only")
    n = min(examples, len(train_src))
    idx = np.sort(private_rng("audit-examples", insecure_seed).choice(len(train_src), n, replace=False))
    spec, model, names, _ = build_model(cfg.model, train_src.num_classes, cfg.seed, weights=cfg.weights, peft=cfg.peft, params=cfg.params,
                                       batchnorm=cfg.batchnorm)
    x = gdata.to_model_input(gdata.read_images(train_src, idx), spec.input_size, spec.channels, "cpu")
    y = torch.as_tensor(train_src.labels(idx))
    public_x = None
    if cfg.method == "gep":
        if not cfg.public:
            raise GSDError("--method gep needs --public (the anchor set) with --private")
        sample = gdata.draw(catalog.resolve(cfg.public) if catalog else gdata.resolve(cfg.public), public_count(cfg), cfg.seed)
        from ..ranking.pipeline import refuse_same_dataset

        for part in private_parts(cfg.private, cfg.private_test, catalog):  # as gsd train refuses it
            refuse_same_dataset(part, [sample], what="GEP anchor set")
        public_x = sample.tensor(spec.input_size, spec.channels, "cpu")
    return model, list(names), (x, y), public_x, train_src.num_classes
