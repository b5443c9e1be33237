"""torchvision backbones for transfer learning (paper 004, Section 5 and Table 8), BatchNorm frozen.

``resnet18``, ``resnet50-bn``, ``resnet152``, ``densenet121`` and ``vit_b_16`` are torchvision's
architectures built with ``weights=None`` (nothing is downloaded here; pre-trained weights come from
``--weights``, see :mod:`gsd_cli.models.weights`), with the classification head sized to the task.
(``resnet50`` is the GroupNorm ResNet-50 of :mod:`probes.resnet50`, meant for training from scratch;
``resnet50-bn`` is torchvision's, whose ImageNet weights load.)

**BatchNorm stays frozen in eval mode** (:class:`FrozenBatchNorm2d`): it always normalises with the
running statistics stored in the weights, whatever ``model.train()`` says, and those statistics are
never updated. Why not GroupNorm, as for training from scratch? (1) A pre-trained backbone's
BatchNorm statistics and affine parameters are part of what was learned; GroupNorm in their place
computes another function, so ImageNet weights would no longer mean anything. (2) In eval mode each
example is normalised by fixed numbers, so one example's output does not depend on the others in the
batch: per-sample gradients (torch.func, Opacus) are exact and DP-SGD's per-example sensitivity holds.
BatchNorm in training mode would mix the batch and break both. (3) The second phase and the private
fine-tuning then change only the chosen parameters: no buffer moves behind the user's back. The
affine weight and bias of a BatchNorm remain ordinary parameters, so BitFit (bias terms) can train
them. The paper's fine-tuning of a few layers of a pre-trained ResNet152 / DenseNet121 is exactly
this setting. Without ``--weights`` the running statistics are torchvision's initial ones (mean 0,
variance 1): a random backbone, useful for listing parameters and for tests, not for accuracy.

``vit_b_16``'s ``nn.MultiheadAttention`` is rebuilt as :class:`LinearSelfAttention` (the same
function and tensors, projections as ``nn.Linear``), so that LoRA can adapt the attention and
per-sample gradients see it. All in-place ReLUs are made out-of-place (Opacus' hooks refuse in-place changes of a hooked layer's
output). Registered at 224x224 (ImageNet); ``NAME@SIZE`` (e.g. ``resnet18@32``) builds a model for
another input size (:func:`probes.get_model_spec`); ViT's patch grid follows the size, so its
224-pixel position embeddings only load at 224.
"""

from __future__ import annotations

import types

import torch
import torch.nn as nn
import torch.nn.functional as F


class FrozenBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d that always uses (and never updates) its running statistics; same state dict as
    ``nn.BatchNorm2d`` (so torchvision weights load), affine weight and bias still parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)


def freeze_batchnorm(model: nn.Module) -> nn.Module:
    """Turn every ``BatchNorm2d`` of ``model`` into a :class:`FrozenBatchNorm2d` in place (same
    tensors) and every in-place ReLU into an out-of-place one. Returns ``model``."""
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm2d) and not isinstance(mod, FrozenBatchNorm2d):
            mod.__class__ = FrozenBatchNorm2d
        if isinstance(mod, nn.ReLU):
            mod.inplace = False
    return model


def _resnet_block_forward(self, x: torch.Tensor) -> torch.Tensor:
    """torchvision's BasicBlock / Bottleneck forward without its in-place ``out += identity``."""
    out = self.relu(self.bn1(self.conv1(x)))
    if hasattr(self, "conv3"):
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
    else:
        out = self.bn2(self.conv2(out))
    identity = x if self.downsample is None else self.downsample(x)
    return self.relu(out + identity)


def _resnet(builder_name: str):
    def build(num_classes: int = 10, in_channels: int = 3) -> nn.Module:
        import torchvision.models as tvm
        from torchvision.models.resnet import BasicBlock, Bottleneck

        net = getattr(tvm, builder_name)(weights=None, num_classes=num_classes)
        for mod in net.modules():
            if isinstance(mod, (BasicBlock, Bottleneck)):
                mod.forward = types.MethodType(_resnet_block_forward, mod)
        if in_channels != 3:
            net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        return freeze_batchnorm(net)

    build.__name__ = builder_name
    build.__doc__ = f"torchvision {builder_name} (weights=None), BatchNorm frozen in eval mode."
    return build


resnet18 = _resnet("resnet18")
resnet50_bn = _resnet("resnet50")
resnet152 = _resnet("resnet152")


def _densenet_forward(self, x: torch.Tensor) -> torch.Tensor:
    out = F.relu(self.features(x))
    out = F.adaptive_avg_pool2d(out, (1, 1)).flatten(1)
    return self.classifier(out)


def densenet121(num_classes: int = 10, in_channels: int = 3) -> nn.Module:
    """torchvision densenet121 (weights=None), BatchNorm frozen in eval mode."""
    from torchvision.models import densenet121 as tv_densenet121

    net = tv_densenet121(weights=None, num_classes=num_classes)
    net.forward = types.MethodType(_densenet_forward, net)  # torchvision's final ReLU is in place
    if in_channels != 3:
        net.features.conv0 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return freeze_batchnorm(net)


class LinearSelfAttention(nn.Module):
    """``nn.MultiheadAttention``'s self-attention (batch first, no mask, no dropout) with its
    projections as ``nn.Linear`` layers: ``in_proj`` (query, key and value stacked, as the fused
    ``in_proj_weight``) and ``out_proj``. The same function and the same tensors, but LoRA (peft) can
    wrap the projections and torch.func sees every parameter. torchvision's state-dict names
    ``in_proj_weight`` / ``in_proj_bias`` load into it (:mod:`gsd_cli.models.weights` renames them)."""

    def __init__(self, mha: nn.MultiheadAttention):
        super().__init__()
        if not (mha._qkv_same_embed_dim and mha.batch_first) or mha.dropout:
            raise ValueError("LinearSelfAttention replaces batch-first self-attention without dropout only")
        e = mha.embed_dim
        self.num_heads = mha.num_heads
        self.in_proj = nn.Linear(e, 3 * e, bias=mha.in_proj_bias is not None)
        self.out_proj = nn.Linear(e, e, bias=mha.out_proj.bias is not None)
        with torch.no_grad():
            self.in_proj.weight.copy_(mha.in_proj_weight)
            self.out_proj.weight.copy_(mha.out_proj.weight)
            if mha.in_proj_bias is not None:
                self.in_proj.bias.copy_(mha.in_proj_bias)
            if mha.out_proj.bias is not None:
                self.out_proj.bias.copy_(mha.out_proj.bias)

    def forward(self, query, key=None, value=None, need_weights: bool = False, **_):
        b, t, e = query.shape
        h = self.num_heads
        q, k, v = self.in_proj(query).view(b, t, 3, h, e // h).permute(2, 0, 3, 1, 4)
        attn = torch.softmax((q @ k.transpose(-2, -1)) * (e // h) ** -0.5, dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, t, e)
        return self.out_proj(out), None


def vit_b_16(num_classes: int = 10, in_channels: int = 3, input_size: int = 224) -> nn.Module:
    """torchvision vit_b_16 (weights=None; LayerNorm, no BatchNorm) for ``input_size`` (a multiple of
    16), its attention as :class:`LinearSelfAttention` (the same function, Linear projections)."""
    from torchvision.models import vit_b_16 as tv_vit

    if input_size % 16:
        raise ValueError(f"vit_b_16 needs an input size that is a multiple of 16 (got {input_size})")
    net = tv_vit(weights=None, num_classes=num_classes, image_size=input_size)
    for block in net.encoder.layers:
        block.self_attention = LinearSelfAttention(block.self_attention)
    if in_channels != 3:
        net.conv_proj = nn.Conv2d(in_channels, net.hidden_dim, kernel_size=16, stride=16)
    return net


# Paper 004 Table 8: the parameter-efficient choices of the second-phase experiments.
RESNET152_PAPER = ("fc.weight", "fc.bias", "layer3.32.conv1.weight")
DENSENET121_PAPER = (
    "classifier.weight", "classifier.bias",
    "features.denseblock3.denselayer23.conv1.weight", "features.denseblock3.denselayer24.conv1.weight",
)
# LoRA on the attention projections of every encoder block (query, key, value and output), as LoRA
# (Hu et al.) adapts attention weights.
VIT_LORA_TARGETS = r".*encoder_layer_\d+\.self_attention\.(in_proj|out_proj)"

#: torchvision weight enums, for ``--weights NAME`` (e.g. IMAGENET1K_V1) where there is internet.
TORCHVISION_WEIGHTS = {
    "resnet18": "ResNet18_Weights", "resnet50-bn": "ResNet50_Weights", "resnet152": "ResNet152_Weights",
    "densenet121": "DenseNet121_Weights", "vit_b_16": "ViT_B_16_Weights",
}
