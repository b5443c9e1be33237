"""Option choices, shared help texts and the options that several commands declare alike."""

from __future__ import annotations

from enum import Enum
import typer


def _choices(name: str, *values: str) -> type[Enum]:
    """A str Enum whose members are ``values`` (Typer shows them as the option's choices)."""
    return Enum(name, [(v, v) for v in values], type=str)


Labels = _choices("Labels", "random", "own")
RowNorm = _choices("RowNorm", "unit", "none")
Device = _choices("Device", "auto", "cpu", "cuda")
DpRepeats = _choices("DpRepeats", "shared", "fresh")
Engine = _choices("Engine", "auto", "vmap", "hooks", "layers")
Method = _choices("Method", "auto", "gep", "dpsgd", "rgp", "topagg", "second-phase")
Accountant = _choices("Accountant", "rdp", "pld")
Schedule = _choices("Schedule", "step", "constant")
BatchNorm = _choices("BatchNorm", "freeze", "groupnorm", "refuse")

WEIGHTS_HELP = "Pre-trained weights: a .safetensors file, a PyTorch state dict or a torchvision weight name (e.g. IMAGENET1K_V1)."
PEFT_HELP = ("Trainable parameters, all else frozen: a model preset (gsd models show NAME), head, bitfit, "
             "lora[:r=8,alpha=8,targets=REGEX] or glob patterns.")
INSECURE_HELP = "Experiments only: draw the private randomness ({what}) from this seed, marking every output NOT DP."
CLASSES_HELP = "The private classes, a count or comma-separated names, where the source has none."
ROOT_HELP = "Built-in datasets' folder (default: $GSD_DATA_ROOT, else $XDG_DATA_HOME/gsd)."

MODEL_FORMS = ", timm:NAME or PATH.py:FACTORY (optionally @SIZE or @SIZExCHANNELS)."
BATCHNORM_HELP = "BatchNorm layers: freeze, groupnorm (replaced) or refuse."

# Each call makes a fresh typer.Option: one per command that declares it.


def batchnorm_option(default: str, panel: str | None = None):
    return typer.Option(BatchNorm(default), "--batchnorm", metavar="POLICY", help=BATCHNORM_HELP.format(default=default),
                        rich_help_panel=panel)


def device_option():
    return typer.Option(Device.auto, "--device", help="auto uses CUDA when there is a GPU.")


def quiet_option(help_text: str):
    return typer.Option(False, "--quiet", "-q", help=help_text)


def insecure_seed_option(what: str):
    return typer.Option(None, "--insecure-seed", help=INSECURE_HELP.format(what=what))


def weights_option(help_text: str = WEIGHTS_HELP):
    return typer.Option(None, "--weights", help=help_text)


def peft_option(help_text: str = PEFT_HELP):
    return typer.Option(None, "--peft", help=help_text)


def classes_option():
    return typer.Option(None, "--classes", help=CLASSES_HELP)


def public_list_option(help_text: str):
    return typer.Option(None, "--public", help=help_text)


def extra_argument():
    """Names after a list option (``--public A B C``): Typer binds only the first to the option."""
    return typer.Argument(None, hidden=True)


def data_root_option(help_text: str = ROOT_HELP):
    return typer.Option(None, "--data-root", help=help_text)


def json_option(help_text: str):
    return typer.Option(None, "--json", help=help_text)


def force_option():
    return typer.Option(False, "--force", help="Write through a symbolic link whose target is not an earlier gsd output "
                        "(default: refused).")


def deterministic_noise_option():
    return typer.Option(False, "--deterministic-noise", help="Deprecated: --insecure-seed equal to --seed.")


def with_options(table: dict):
    """A typer command ``fn(ctx, **options)`` that takes the options of ``table`` (name -> (type, typer option or
    argument)), as if each were a parameter of its signature: the command's options stay a table (data), and its
    body short. Typer reads the signature (``inspect.signature`` honours ``__signature__``)."""
    import inspect

    def decorate(fn):
        P = inspect.Parameter
        params = [P("ctx", P.POSITIONAL_OR_KEYWORD, annotation=typer.Context)]
        params += [P(name, P.KEYWORD_ONLY, default=default, annotation=kind) for name, (kind, default) in table.items()]
        fn.__signature__ = inspect.Signature(params, return_annotation=None)
        fn.__annotations__ = {"ctx": typer.Context, **{name: kind for name, (kind, _) in table.items()}, "return": None}
        return fn

    return decorate
