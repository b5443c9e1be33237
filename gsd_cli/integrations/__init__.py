"""Integrations with other tools: nothing in gsd depends on them, they depend on gsd.

* :mod:`.opacus`: GEP inside an Opacus training script (``GEPOptimizer``, its accountant, secret
  sampling for Opacus's loader);
* :mod:`.tracking`: ``--log tensorboard|mlflow``.
"""
