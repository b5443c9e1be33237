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

WEIGHTS_HELP = ("Pre-trained weights: a .safetensors file or a PyTorch state dict (loaded with weights_only=True, never an "
                "arbitrary pickle), or a torchvision weight name such as IMAGENET1K_V1 (downloads; needs internet). The head is "
                "new, sized to the private task.")
PEFT_HELP = ("Trainable parameters: a model preset (gsd models show NAME, e.g. paper = paper 004 Table 8), head, bitfit, "
             "lora[:r=8,alpha=8,targets=REGEX], or names/glob patterns ('fc,layer3.32.conv1.weight'); all else frozen. The "
             "same choice in gsd rank and gsd train gives distances on the trained parameters.")
INSECURE_HELP = ("Experiments only: draw the private randomness ({what}) from this seed instead of the operating "
                 "system, so that a run can be repeated exactly. Every output is then marked NOT differentially private.")
CLASSES_HELP = ("The private set's classes, a count (10) or comma-separated names, where its source declares none "
                "(npz without a 'classes' array, CSV label values): a private model's shape must not be read off the private labels.")
ROOT_HELP = "Folder of the built-in datasets. Default: $GSD_DATA_ROOT, else $XDG_DATA_HOME/gsd (~/.local/share/gsd)."

MODEL_FORMS = ("; also timm:NAME (pip install 'gsd-cli[timm]'; pretrained=False, --weights FILE for pre-trained weights) or "
               "PATH.py:FACTORY (your nn.Module, FACTORY(num_classes=N); loading it runs that file), each with @SIZE or "
               "@SIZExCHANNELS for its input (gsd_cli.models.spec).")
BATCHNORM_HELP = ("BatchNorm layers, which mix the examples of a batch and so break exact per-sample gradients: freeze (running "
                  "statistics, fixed: for pre-trained weights), groupnorm (Opacus's GroupNorm replacement: from scratch), "
                  "refuse (an error naming them). Default: {default}.")

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
    return typer.Option(False, "--force", help="Write an output file through a symbolic link even when the link's target is "
                        "not an earlier gsd output (default: refused, so that a link cannot make gsd replace another file).")


def deterministic_noise_option():
    return typer.Option(False, "--deterministic-noise", help="Deprecated: --insecure-seed with the value of --seed.")
