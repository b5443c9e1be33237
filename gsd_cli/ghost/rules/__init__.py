"""The Gram path's layer rules, one module each; importing this package registers them all.

* :mod:`.linear` (``linear``), :mod:`.conv` (``conv2d``), :mod:`.embedding` (``embedding``): rules by
  module type (:func:`gsd_cli.ghost.registry.register_rule`); Linear and Conv2d share :mod:`.pairs`;
* :mod:`.opacus_samplers` (``opacus``: norm layers and the rest of Opacus' samplers) and
  :mod:`.materialised` (``func``: torch.func on the module alone): fallbacks
  (:func:`gsd_cli.ghost.registry.register_fallback`).

A rule for a new layer type is one new module here, decorated with ``register_rule``, and one line
below.
"""

from . import conv, embedding, linear, materialised, opacus_samplers  # noqa: F401  (they register themselves)
