"""What RoPE a model has and what a method would change, per layer type — so a user can trust a patch.

print(extend.inspect(model))                    # or: ropebench inspect MODEL
print(extend.inspect(model, "yarn", factor=2))  #     ropebench inspect MODEL --method yarn --factor 2
"""

from __future__ import annotations

import math

import torch
from torch import nn

from . import theory
from .errors import ExtendError
from .families import family, rotary_module
from .patching import current, length_dependent, patched, rope_bases
from .prefix_cache import FORCE_GQA, NATIVE_GQA
from .shipped import context_for, global_type, shipped_ropes


def _wavelengths(inv_freq: torch.Tensor) -> str:
    wave = 2 * math.pi / inv_freq.double()
    return f"{float(wave.min()):.4g}..{float(wave.max()):.4g}"


def inspect(model: nn.Module, method: str | None = None, factor: float = 1.0, **options) -> str:
    """A report (plain text) of the model's RoPE per layer type: rotary dims, theta, shipped rope type and
    factor, trained context (pretrained / as shipped), attention window; with `method`, what patching with it
    at `factor` (and `options`) changes: layer types extended, trained context used, wavelength range,
    attention temperature and where it goes, and whether frequencies then depend on the length. Each layer
    type also gets what RoPE theory predicts from its frequencies (extend/theory.py: Men et al.'s base bound,
    Liu et al.'s critical dimension, YaRN's ramp), and the process-wide changes the patch makes ("global
    changes": e.g. the family function xpos wraps), or none."""
    if current(model) is not None:
        raise ExtendError("inspect an unpatched model — undo the active patch first")
    rotary = rotary_module(model)
    shipped = shipped_ropes(model.config)
    bases = rope_bases(model, rotary)
    lines = [
        (
            f"model family {family(model)}; trained context {context_for(shipped, 'pretrained')} pretrained, "
            f"{context_for(shipped, 'shipped')} as shipped (from the {global_type(shipped) or 'single'} "
            f"layer type); length-dependent RoPE as loaded: {'yes' if length_dependent(model) else 'no'}"
        )
    ]
    for lt, info in shipped.items():
        base = bases[lt]
        window = "global" if info.window is None else f"window {info.window}"
        lines.append(
            f"  {lt or 'all layers'}: rotary dims {base.dim} of head_dim {base.head_dim}, theta "
            f"{info.theta:g}, shipped {info.label()}, context {info.pretrained_context} pretrained / "
            f"{info.shipped_context} shipped, {window}, wavelengths {_wavelengths(base.inv_freq)}"
        )
        lines.append(
            "    "
            + theory.describe(
                base.inv_freq.double().cpu().numpy(),
                theta=info.theta,
                dim=base.dim,
                trained_context=info.shipped_context,
            )
        )
    if method is None:
        return "\n".join(lines)
    pretrained = rope_bases(model, rotary, start_from="pretrained")
    with patched(model, method, factor, **options) as handle:
        target = math.ceil(handle.options["trained_context"] * factor)
        extended = handle.extended_layer_types
        after, loaded, trained = {}, {}, {}
        for lt in handle.layer_types:  # dynamic methods: shown at factor x the trained context
            after[lt] = (
                handle.frequencies(lt, target).inv_freq.detach().double().cpu(),
                handle.scalings(lt, target),
            )
            loaded[lt] = handle.loaded_frequencies(lt).double().cpu()  # as loaded (its shipped ones, if any)
            # what the model was trained with, from the start the patch takes (Liu et al.'s d_crit)
            start = pretrained[lt].inv_freq if handle.options["start_from"] == "pretrained" else loaded[lt]
            trained[lt] = start.double().cpu()
        changes = [f"    {c.name}: {c.description}" for c in handle.global_changes]
    opts = ", ".join(f"{k}={v}" for k, v in sorted(handle.options.items()))
    lines.append(f"{method} x{factor:g}: {opts}")
    for lt, (inv_freq, (scaling, logits)) in after.items():
        before = loaded[lt]
        rotating = before != 0  # a stopped pair (p-RoPE) has no ratio
        ratio = inv_freq[rotating] / before[rotating] if bool(rotating.any()) else torch.ones(1)
        changed = int((~torch.isclose(inv_freq, before, rtol=1e-6, atol=0)).sum())
        what = "extended" if lt in extended else "kept"
        temp = f"cos/sin x{scaling:.4g}"
        if logits is not None:
            temp += f", attention logits x{logits:.4g}"
        lines.append(
            f"  {lt or 'all layers'}: {what}; {changed} of {len(before)} frequency pairs differ from the "
            f"loaded model (ratio {float(ratio.min()):.4g}..{float(ratio.max()):.4g}), wavelengths "
            f"{_wavelengths(inv_freq)}; {temp}"
        )
        lines.append(
            "    "
            + theory.describe(
                inv_freq.numpy(),
                theta=shipped[lt].theta,
                dim=len(inv_freq) * 2,
                trained_context=handle.options["trained_context"],
                target=target,
                trained_inv_freq=trained[lt].numpy(),
            )
        )
    if handle.length_dependent:
        lines.append(
            f"  frequencies depend on the sequence length (shown at {factor:g} x the trained context); "
            f"one generate/score call keeps one set under extend.fixed_length(model, n)"
        )
    lines.append("  global changes (process-wide, restored by undo):" + ("" if changes else " none"))
    lines += changes
    lines.append(f"  per call on CPU, not by the patch: {FORCE_GQA}=1 — {NATIVE_GQA}")
    return "\n".join(lines)


def skeleton(config) -> nn.Module:
    """A model with the config's layout but no weights (meta device), and a real rotary module: enough to
    inspect a checkpoint's RoPE without loading it."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    rotary = getattr(model.base_model, "rotary_emb", None)
    if isinstance(rotary, nn.Module):
        model.base_model.rotary_emb = type(rotary)(config=config)
    return model
