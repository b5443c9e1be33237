"""A *base*: a model gsd pre-trained on public sets (``gsd pretrain``, :func:`gsd_cli.train.pretrain.pretrain_base`),
read back as ``--weights BASE`` (stage 0 of paper 004's Figure 2, W_pt).

A base is a folder of two files:

* ``weights.safetensors``: the model's state dict, its head sized to the public sets' classes;
* ``card.json``: what the base saw and how it was built (:data:`CARD_FORMAT`): the public sets (name, fingerprint,
  examples, classes, their offset in the head), the model (``model``, ``architecture``, ``input_size``,
  ``channels``, ``head``), the training settings, the gsd version, the SHA-256 of ``weights.safetensors`` and the name and
  shape of every tensor in it.

``--weights BASE`` (the folder, or its ``weights.safetensors``) is checked before anything loads, each failure one
line (:class:`~gsd_cli.errors.ModelError`, exit 2): the card must be readable and of this format, the weights file
present with the card's SHA-256 and exactly the card's tensors and shapes (:func:`read_base`); and the base must fit
the model asked for, the same architecture, input size and channels (:func:`check_base_fits`). Then
:func:`gsd_cli.models.weights.load_weights` loads every tensor but the head's, which is new, sized to the private task.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import ModelError

CARD = "card.json"
WEIGHTS = "weights.safetensors"
#: the card's format; a card of another format is refused
CARD_FORMAT = "gsd-base-1"


def base_folder(source) -> Path | None:
    """The base folder ``source`` names (the folder itself, or its ``weights.safetensors``), None when it names no base
    (no ``card.json`` there: an ordinary weights file or a torchvision weight name)."""
    try:
        path = Path(str(source)).expanduser()
        if path.is_dir():
            return path if (path / CARD).exists() else None
        if path.name == WEIGHTS and (path.parent / CARD).exists():
            return path.parent
    except (OSError, ValueError):
        return None
    return None


def architecture(label: str) -> str:
    """The architecture part of a model label: ``fmnist-cnn`` of ``fmnist-cnn@28x1``, ``module:Net`` of
    ``module:Net#a1b2...`` (the input size and a module's weights digest are not the architecture)."""
    from probes import parse_input

    label = str(label)
    if label.startswith("module:"):
        return label.partition("#")[0]
    try:
        return parse_input(label)[0]
    except KeyError:
        return label


def tensor_list(state: dict) -> dict[str, list[int]]:
    """Every tensor's name and shape, as the card lists them."""
    return {k: [int(d) for d in v.shape] for k, v in sorted(state.items())}


def read_card(folder: Path) -> tuple[dict, str]:
    """``(card, SHA-256 of card.json)`` of the base ``folder``; one line when it is unreadable or of another format."""
    path = folder / CARD
    try:
        data = path.read_bytes()
        card = json.loads(data)
    except (OSError, ValueError) as e:
        raise ModelError(f"--weights {folder}: {CARD} is not readable JSON ({type(e).__name__}); rebuild the base with gsd pretrain") from None
    if not isinstance(card, dict) or card.get("format") != CARD_FORMAT:
        raise ModelError(f"--weights {folder}: {CARD} is not a gsd base card (format {CARD_FORMAT}); rebuild the base with gsd pretrain")
    if not isinstance(card.get("tensors"), dict) or not isinstance(card.get("weights_sha256"), str):
        raise ModelError(f"--weights {folder}: {CARD} lists no tensors or no weights digest; rebuild the base with gsd pretrain")
    return card, hashlib.sha256(data).hexdigest()


def read_base(folder: Path) -> tuple[dict, dict, dict]:
    """``(state, card, info)`` of the base ``folder``, the weights checked against the card (module docstring)."""
    card, card_sha = read_card(folder)
    wfile = folder / WEIGHTS
    if not wfile.is_file():
        raise ModelError(f"--weights {folder}: {WEIGHTS} is missing beside {CARD}; rebuild the base with gsd pretrain")
    from ..memory import check_fits

    check_fits(2 * wfile.stat().st_size, f"--weights {folder} ({wfile.stat().st_size:,} bytes, read and then loaded)",
               "free memory, or build a smaller base")
    data = wfile.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    if sha != card["weights_sha256"]:
        raise ModelError(f"--weights {folder}: {WEIGHTS} is not the file {CARD} describes (SHA-256 {sha[:12]}..., the card says "
                         f"{card['weights_sha256'][:12]}...); the folder was edited or mixes two bases: rebuild it with gsd pretrain")
    from safetensors.torch import load as st_load

    try:
        state = st_load(data)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same user error
        raise ModelError(f"--weights {folder}: {WEIGHTS} is not a readable safetensors file ({str(e).splitlines()[0]})") from None
    _check_tensors(folder, card["tensors"], tensor_list(state))
    info = {"source": str(folder), "format": "gsd base", "sha256": sha, "bytes": len(data),
            "base": {"path": str(folder.resolve()), "card_sha256": card_sha, "weights_sha256": sha,
                     "model": card.get("model"), "public": [s.get("name") for s in card.get("sets", [])],
                     "gsd_version": card.get("gsd_version")}}
    return state, card, info


def _check_tensors(folder: Path, listed: dict, found: dict) -> None:
    """The weights hold exactly the card's tensors, each of the card's shape."""
    missing, extra = sorted(set(listed) - set(found)), sorted(set(found) - set(listed))
    if missing or extra:
        parts = ([f"{len(missing)} tensor(s) of the card missing ({', '.join(missing[:4])})"] if missing else []) + (
            [f"{len(extra)} not on the card ({', '.join(extra[:4])})"] if extra else [])
        raise ModelError(f"--weights {folder}: {WEIGHTS} does not hold the card's tensors: {'; '.join(parts)}; rebuild the base with gsd pretrain")
    bad = [f"{k} {tuple(found[k])} vs {tuple(listed[k])} on the card" for k in listed if list(listed[k]) != list(found[k])]
    if bad:
        raise ModelError(f"--weights {folder}: shapes in {WEIGHTS} differ from {CARD}: {', '.join(bad[:4])}; rebuild the base with gsd pretrain")


def check_base_fits(folder: Path, card: dict, model_name: str | None, spec=None) -> None:
    """Refuse (one line) a base built for another architecture, input size or channel count than the model
    ``model_name`` (its ``spec``: the resolved input size and channels)."""
    want = architecture(model_name) if model_name is not None else None
    have = card.get("architecture") or architecture(str(card.get("model")))
    if want is not None and want != have:
        raise ModelError(f"--weights {folder}: the base was built for model {card.get('model')}, not {model_name}; "
                         f"give --model {card.get('model')}, or build a base for {model_name} with gsd pretrain --model {model_name}")
    size, chans = getattr(spec, "input_size", None), getattr(spec, "channels", None)
    for what, mine, theirs in (("input size", size, card.get("input_size")), ("channel count", chans, card.get("channels"))):
        if mine is not None and theirs is not None and int(mine) != int(theirs):
            raise ModelError(f"--weights {folder}: the base was built for {what} {theirs} ({card.get('model')}), the model here "
                             f"takes {mine} ({model_name}); give --model {card.get('model')}")
