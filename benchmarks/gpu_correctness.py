"""The correctness half of the GPU check (benchmarks/gpu_check.py): every registered method on every tested
family's tiny random model (benchmarks/tiny_models.py), under each attention implementation, on `device`:

- factor 1 is bit-identical to the unpatched model (where the method promises it: identity_at_one, the remap
  methods, plain; the others' difference is reported, not judged);
- patched on `device` equals patched on the CPU, both float32, within TOL_ULPS float32 ulps of the logits'
  scale (TF32 is switched off for the comparison; on a CPU this compares the CPU with itself);
- the patched rotary module's inverse frequencies sit on `device` in float32;
- the remap methods (self-extend, rerope, dca) past their window equal a float64 reference attention built
  from the method's own relative positions (`Remap.relative_positions`) on REFERENCE_FAMILIES;
- xpos under `generate` (KV cache, extend.fixed_length) equals a full forward of the generated sequence;
- undo() restores the model exactly: logits, every buffer (value, dtype, device), the rotary module, the
  attention implementation.

Each check is one row {family, attn, method, check, ok, detail}; ok None means "not judged" (reported only).
"""

from __future__ import annotations

import importlib.util
import math
import traceback

TOL_ULPS = 256  # float32 ulps of the logits' scale: reduction order differs between CPU and CUDA kernels
REFERENCE_FAMILIES = ("llama", "mistral", "qwen2")  # half-layout RoPE on every dim: the float64 reference's
REF_NAME = "ropebench_gpu_check_reference64"


def attn_implementations(device: str) -> list[str]:
    """sdpa and eager everywhere; flash-attention-2 on CUDA where the flash_attn package is installed."""
    found = ["sdpa", "eager"]
    if str(device).startswith("cuda") and importlib.util.find_spec("flash_attn") is not None:
        found.append("flash_attention_2")
    return found


def tolerance(reference, ulps: float = TOL_ULPS) -> float:
    import torch

    return ulps * torch.finfo(torch.float32).eps * max(1.0, float(reference.abs().max()))


def logits(model, ids, **kwargs):
    import torch
    from ropebench.extend.forward import device_of

    with torch.no_grad():
        return model(ids.to(device_of(model)), **kwargs).logits.float().cpu()


def method_options(method: str, config, factor: float) -> dict:
    """Options a method needs that have no default (longrope's per-frequency factors: 1 short, `factor`
    long)."""
    if method != "longrope":
        return {}
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    params = config.rope_parameters if "rope_theta" in (config.rope_parameters or {}) else {}
    partial = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None) or 1.0)
    half = int(head_dim * partial) // 2
    return {"short_factor": [1.0] * half, "long_factor": [float(factor)] * half}


def snapshot(model) -> dict:
    return {
        "buffers": {n: b.detach().clone() for n, b in model.named_buffers()},
        "rotary": model.base_model.rotary_emb,
        "attn": model.config._attn_implementation,
    }


def restored(model, before: dict) -> str | None:
    """None when the model is as `before`; else what differs."""
    import torch

    if model.base_model.rotary_emb is not before["rotary"]:
        return "the rotary module was not put back"
    if model.config._attn_implementation != before["attn"]:
        return f"attention implementation {model.config._attn_implementation!r} != {before['attn']!r}"
    now = dict(model.named_buffers())
    for name, old in before["buffers"].items():
        new = now.get(name)
        if new is None or new.dtype != old.dtype or new.device != old.device or not torch.equal(new, old):
            return f"buffer {name} differs"
    return None


def frequencies_placed(model, device) -> str | None:
    """None when every inverse-frequency tensor of the patched rotary module is on `device` in float32."""
    import torch

    rotary = getattr(model.base_model.rotary_emb, "rotary", model.base_model.rotary_emb)
    kind = torch.device(device).type
    attributes = [(name, value) for name, value in vars(rotary).items() if isinstance(value, torch.Tensor)]
    for name, value in [*attributes, *rotary.named_buffers()]:
        if name.endswith("inv_freq") and (value.device.type != kind or value.dtype != torch.float32):
            return f"{name} on {value.device} in {value.dtype}"
    return None


def _rotate64(x, angle):
    """Half-layout RoPE of x (float64) by `angle` (..., dim / 2)."""
    import torch

    cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def _reference_attention(rel, inv_freq):
    """An attention function: undo the model's plain rotation of q and k, then score every (i, j) at the
    relative position rel[i, j] (NaN: masked), all in float64 (prefill only)."""
    import torch

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        n = query.shape[2]
        plain = torch.arange(n, dtype=torch.float64, device=query.device)[:, None] * inv_freq[None, :]
        q0, k0 = _rotate64(query.double(), -plain), _rotate64(key.double(), -plain)
        groups = query.shape[1] // key.shape[1]
        k0, v0 = k0.repeat_interleave(groups, 1), value.double().repeat_interleave(groups, 1)
        r = rel[:n, :n].to(query.device)
        turned = _rotate64(q0[:, :, :, None, :], r.nan_to_num(0.0)[..., None] * inv_freq)  # b h i j d
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        scores = (turned * k0[:, :, None]).sum(-1) * scale
        weights = scores.masked_fill(r.isnan(), -math.inf).softmax(-1)
        return (weights @ v0).transpose(1, 2).to(query.dtype).contiguous(), None

    return attend


def reference_logits(family: str, method: str, factor: float, ids, *, seed: int):
    """Logits of the unpatched CPU float32 model of `family` whose attention scores each pair at the remap
    method's relative position, in float64."""
    import torch
    from ropebench.benchmarks.tiny_models import build_family
    from ropebench.extend import registry
    from ropebench.extend.patching import rope_bases
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    model = build_family(family, seed=seed)
    rotary = model.base_model.rotary_emb
    spec = registry.get(method)
    remap = spec.fn(rope_bases(model, rotary)[None], factor=factor, **spec.options_with_defaults())
    positions = torch.arange(ids.shape[1])
    rel = remap.relative_positions(positions, positions)
    AttentionInterface.register(REF_NAME, _reference_attention(rel, rotary.inv_freq.double()))
    AttentionMaskInterface.register(REF_NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    try:
        for config in configs.values():
            config._attn_implementation = REF_NAME
        return logits(model, ids)
    finally:
        for interface in (AttentionInterface, AttentionMaskInterface):
            getattr(interface, "_global_mapping", {}).pop(REF_NAME, None)


def xpos_generate_gap(model, ids, *, prompt: int, new: int) -> tuple[float, float]:
    """(max |generate's logits - a full forward's|, tolerance) for xpos with its automatic centre: `generate`
    with its KV cache keeps the prompt's centre, so each step equals one forward of the sequence before it."""
    import torch
    from ropebench import extend
    from ropebench.extend.forward import device_of

    x = ids[:, :prompt].to(device_of(model))
    with extend.patched(model, "xpos", factor=2.0), torch.no_grad():
        out = model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        full = logits(model, out.sequences[:, :-1])[0, prompt - 1 :]
    stepped = torch.cat([s.float().cpu() for s in out.logits])
    gap = float((stepped - full).abs().max())
    # sqrt(eps) of the logits' scale in the model's dtype: cached steps round apart from one forward
    eps = torch.finfo(next(model.parameters()).dtype).eps
    return gap, eps**0.5 * max(1.0, float(full.abs().max()))


def identity_remap(model, spec) -> bool:
    """A remap method that promises plain RoPE at factor 1 (self-extend, rerope: plain_within is infinite;
    DCA still cuts chunks there)."""
    from ropebench.extend.patching import rope_bases

    if not spec.remap:
        return False
    bases = rope_bases(model, model.base_model.rotary_emb)
    remap = spec.fn(next(iter(bases.values())), factor=1.0, **spec.options_with_defaults())
    return math.isinf(remap.plain_within)


def _row(family, attn, method, check, ok, detail=""):
    return {"family": family, "attn": attn, "method": method, "check": check, "ok": ok, "detail": detail}


def family_rows(
    family: str, attn: str, *, device: str, methods: list[str], length: int, factor: float, seed: int
):
    """Every check of every method on one family under one attention implementation."""
    import torch
    from ropebench import extend
    from ropebench.benchmarks.tiny_models import build_family
    from ropebench.extend import registry

    fp32 = attn != "flash_attention_2"  # flash-attention-2 runs only in half precision
    dtype = torch.float32 if fp32 else torch.bfloat16
    try:
        dev = build_family(family, seed=seed, attn_implementation=attn, dtype=dtype, device=device)
    except (ValueError, ImportError) as e:  # transformers has no such path for this family (Gemma2: no sdpa)
        return [_row(family, attn, "-", "build", None, f"not available: {str(e).splitlines()[0][:160]}")]
    cpu = build_family(family, seed=seed, attn_implementation=attn) if fp32 else None
    ids = torch.randint(
        0, dev.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed + 1)
    )
    base = logits(dev, ids)
    rows = []
    for method in methods:
        spec = registry.get(method)
        f = 1.0 if method == "plain" else factor
        options = method_options(method, dev.config, f)
        try:
            before = snapshot(dev)
            with extend.patched(dev, method, 1.0, **method_options(method, dev.config, 1.0)):
                one = logits(dev, ids)
            claimed = spec.identity_at_one or method == "plain" or identity_remap(dev, spec)
            same = torch.equal(one, base)
            detail = "bit-identical" if same else f"max |diff| {float((one - base).abs().max()):.2e}"
            rows.append(_row(family, attn, method, "factor 1 = unpatched", same if claimed else None, detail))
            with extend.patched(dev, method, f, **options):
                placed = frequencies_placed(dev, device)
                got = logits(dev, ids)
            rows.append(
                _row(family, attn, method, "inv_freq on device, float32", placed is None, placed or "")
            )
            after = logits(dev, ids)
            problem = restored(dev, before) or (
                None if torch.equal(after, base) else "logits differ after undo"
            )
            rows.append(_row(family, attn, method, "undo restores exactly", problem is None, problem or ""))
        except extend.ExtendError as e:  # a refusal by design (e.g. remap on soft-capped Gemma2, fa2)
            rows.append(_row(family, attn, method, "patch", None, f"refused: {str(e)[:160]}"))
            continue
        except Exception as e:  # noqa: BLE001 - a failure of this method is a row, the check goes on
            rows.append(_row(family, attn, method, "run", False, f"{type(e).__name__}: {str(e)[:200]}"))
            traceback.print_exc()
            continue
        if cpu is not None:
            rows += _compare_rows(family, attn, method, cpu, got, ids, f, options, seed)
        if method == "xpos":
            rows.append(_xpos_row(family, attn, dev, ids))
    return rows


def _compare_rows(family, attn, method, cpu, got, ids, f, options, seed):
    from ropebench import extend
    from ropebench.extend import registry

    rows = []
    try:
        with extend.patched(cpu, method, f, **options):
            want = logits(cpu, ids)
        diff, tol = float((got - want).abs().max()), tolerance(want)
        rows.append(
            _row(family, attn, method, "device = CPU (fp32)", diff <= tol, f"{diff:.2e} (tol {tol:.2e})")
        )
        if registry.get(method).remap and family in REFERENCE_FAMILIES and attn == "sdpa":
            ref = reference_logits(family, method, f, ids, seed=seed)
            diff, tol = float((got - ref).abs().max()), tolerance(ref)
            far = float((want - logits(cpu, ids)).abs().max())  # the remap really differs from plain here
            ok = diff <= tol and far > 10 * tol
            detail = f"{diff:.2e} (tol {tol:.2e}; remap vs plain {far:.2e})"
            rows.append(_row(family, attn, method, "remap = float64 reference", ok, detail))
    except Exception as e:  # noqa: BLE001
        rows.append(
            _row(family, attn, method, "device = CPU (fp32)", False, f"{type(e).__name__}: {e}"[:200])
        )
    return rows


def _xpos_row(family, attn, dev, ids):
    try:
        gap, tol = xpos_generate_gap(dev, ids, prompt=ids.shape[1] // 2, new=8)
        return _row(family, attn, "xpos", "generate = full forward", gap <= tol, f"{gap:.2e} (tol {tol:.2e})")
    except Exception as e:  # noqa: BLE001
        return _row(family, attn, "xpos", "generate = full forward", False, f"{type(e).__name__}: {e}"[:200])


def correctness(
    *, device: str, families: list[str], methods: list[str], length: int, factor: float, seed: int
):
    """Every row of every family x attention implementation; TF32 off while it runs (exact float32)."""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        rows = []
        for family in families:
            for attn in attn_implementations(device):
                rows += family_rows(
                    family, attn, device=device, methods=methods, length=length, factor=factor, seed=seed
                )
        return rows
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
