"""A setting ropebench measured (method, factor, options), written in the form an engine reads: transformers'
`rope_parameters`, vLLM's `--hf-overrides`, llama.cpp's flags. Pure mapping from the method spec and the model
config (no weights, no engine imported); `ropebench export` (scripts/export_cli.py) writes what it returns.

Methods an engine has no equivalent of are refused for it (ExportError naming what the engine lacks), never
approximated. PARITY says, per (engine, method), whether the engine's function was measured equal to
ropebench's patch, is known to differ (the formula difference named), or was not measured; `gate` refuses a
known difference unless the caller allows it. docs/export.md explains each row.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from . import registry
from .errors import ExtendError
from .shipped import context_for, default_extended, rotary_fraction, shipped_ropes

ENGINES = ("transformers", "vllm", "llama.cpp")


class ExportError(ExtendError):
    """A setting that cannot be exported to the engine asked for (one line: what the engine lacks)."""


@dataclass(frozen=True)
class Parity:
    """Whether an engine computes what ropebench measured: "measured" (equal, how in `detail`), "differs"
    (known to differ: the formula difference in `detail`; exported only when allowed) or "not measured"."""

    status: str
    detail: str


_TESTED = (
    "on the tiny family models and smollm2-135m, loaded by a Python without ropebench "
    "(tests/extend/test_export.py)"
)
_TF_MEASURED = (
    "rotary frequencies, attention scaling, cos/sin and logits bit-equal to ropebench's patch (fp32), "
    + _TESTED
)
_NOT_MEASURED = "the mapping follows the engine's source, read, not run here"

# (engine, method) -> Parity. A method absent for an engine has no equivalent there (see LACKS).
PARITY: dict[tuple[str, str], Parity] = {
    **{
        ("transformers", m): Parity("measured", _TF_MEASURED)
        for m in ("plain", "pi", "ntk", "ntk-parts", "yarn", "llama3", "longrope", "proportional")
    },
    ("transformers", "dynamic-ntk"): Parity(
        "measured",
        "frequencies, scaling, cos/sin and logits equal to ropebench's patch within float32 rounding, not "
        "bit for bit (transformers computes the scale from the length in float32, ropebench in float64), "
        + _TESTED
        + "; transformers' `dynamic` keeps the frequencies of the longest length a model instance has run (a "
        "shorter call after a longer one reuses them), ropebench's are stateless",
    ),
    **{
        ("vllm", m): Parity("not measured", _NOT_MEASURED + " (no GPU with vLLM in this session)")
        for m in ("plain", "pi", "ntk", "yarn", "llama3", "longrope", "proportional")
    },
    ("vllm", "ntk-parts"): Parity(
        "not measured",
        "vLLM's YaRN reads `attn_factor` as a multiplier of its own 0.1 ln s + 1 and not transformers' "
        "`attention_factor`: both keys are written; " + _NOT_MEASURED,
    ),
    ("vllm", "dynamic-ntk"): Parity(
        "differs",
        "vLLM's `dynamic` is static: one base for max_position_embeddings x s, b (s^2 - s + 1)^(d/(d-2)), at "
        "every length; ropebench (and transformers) take s from each forward's length",
    ),
    **{
        ("llama.cpp", m): Parity(
            "measured",
            "perplexity ratio to plain at 12288 tokens on the embedded Q4_1 GGUF within 0.3% of ropebench's "
            "on its fp32 snapshot, by the printed flags and by the --gguf-copy file alike, at the method's "
            "default options (llama-cpp-python 0.3.36; `ropebench bench llamacpp-parity`, docs/export.md)",
        )
        for m in ("plain", "pi", "ntk", "ntk-parts", "yarn")
    },
}

# What an engine lacks, per method without an equivalent there (the refusal's reason).
_REMAP = "position remapping changes the attention, not the rotary frequencies"
LACKS: dict[str, dict[str, str]] = {
    "transformers": {
        "dynamic-yarn": "no length-dependent YaRN rope type (its `dynamic` is NTK only)",
        "xpos": "no xPos decay on q and k",
        "self-extend": f"no Self-Extend attention ({_REMAP})",
        "rerope": f"no ReRoPE attention ({_REMAP})",
        "dca": f"no Dual Chunk Attention ({_REMAP})",
    },
    "llama.cpp": {
        "dynamic-ntk": "no length-dependent NTK: its rope base is fixed for the whole context",
        "dynamic-yarn": "no length-dependent YaRN: its rope scale is fixed for the whole context",
        "llama3": "no flag for Llama 3.1's bands: they come from a `rope_freqs` tensor written into the GGUF",
        "longrope": "no flag for per-pair factors: they come from `rope_factors_*` tensors in the GGUF",
        "proportional": "no flag that stops rotary pairs (p-RoPE)",
        "xpos": "no xPos decay on q and k",
        "self-extend": f"no Self-Extend mapped by ropebench ({_REMAP})",
        "rerope": f"no ReRoPE attention ({_REMAP})",
        "dca": f"no Dual Chunk Attention ({_REMAP})",
    },
}
LACKS["vllm"] = dict(LACKS["transformers"])  # vLLM reads transformers' config: what it cannot say, vLLM lacks

# ropebench method -> transformers rope type
ROPE_TYPES = {
    "plain": None,
    "pi": "linear",
    "ntk": "default",
    "dynamic-ntk": "dynamic",
    "ntk-parts": "yarn",
    "yarn": "yarn",
    "llama3": "llama3",
    "longrope": "longrope",
    "proportional": "proportional",
}
# llama.cpp's llama_rope_scaling_type values (llama.h), for llama-cpp-python's `rope_scaling_type`
LLAMA_ROPE_SCALING = {"none": 0, "linear": 1, "yarn": 2}


@dataclass
class Export:
    """What exporting (method, factor, options) of one model to one engine writes and says."""

    engine: str
    method: str
    factor: float
    options: dict
    parity: Parity
    config_updates: dict = field(default_factory=dict)  # transformers: top-level config keys -> values
    hf_overrides: dict = field(default_factory=dict)  # vLLM
    context: int | None = None  # the longest length the setting is meant for (None: any)
    flags: list = field(default_factory=list)  # llama.cpp CLI
    kwargs: dict = field(default_factory=dict)  # llama-cpp-python Llama(...) / vLLM LLM(...) keywords
    notes: list = field(default_factory=list)


def _refuse(engine: str, method: str, why: str) -> ExportError:
    return ExportError(f"{engine} has no equivalent of method {method!r}: {why} — export to another engine")


def _yarn_attention(factor: float, given: float | None) -> float:
    """The attention factor YaRN applies (transformers' and the paper's default 0.1 ln s + 1)."""
    if given is not None:
        return float(given)
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def method_attention(method: str, factor: float, options: dict, context: int) -> float:
    """The attention factor (temperature) the method applies at `factor`; 1 where it applies none."""
    if method == "yarn":
        return _yarn_attention(factor, options.get("attention_factor"))
    if method == "longrope":
        given = options.get("attention_factor")
        if given is not None:
            return float(given)
        return math.sqrt(1 + math.log(factor) / math.log(context)) if factor > 1 else 1.0
    return 1.0


@dataclass(frozen=True)
class _Model:
    """What the mapping needs from a config."""

    shipped: dict
    context: int
    extended: list
    dims: dict  # layer type -> (rotary dims, head_dim)


def _model(config, options: dict) -> _Model | _ScaledModel:
    """The config's RoPE as the mapping needs it; a _ScaledModel when the model ships a scaling (a method on
    top of it has no engine form)."""
    shipped = shipped_ropes(config)
    context = int(options.get("original_max_position_embeddings") or context_for(shipped, "pretrained"))
    chosen = options.get("layer_types")
    chosen = [chosen] if isinstance(chosen, str) else chosen
    extended = list(chosen) if chosen else default_extended(shipped, context)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dims = {}
    for lt in shipped:
        params = config.rope_parameters[lt] if lt else config.rope_parameters
        dims[lt] = (int(head_dim * rotary_fraction(config, params)), head_dim)
    model = _Model(shipped, context, extended, dims)
    scaled = sorted(f"{lt or 'all layers'}: {s.label()}" for lt, s in shipped.items() if s.scaled)
    return _ScaledModel(scaled, model) if scaled else model


@dataclass(frozen=True)
class _ScaledModel:
    scaled: list
    model: _Model


def _rope_parameters(method: str, factor: float, options: dict, theta: float, dim: int, model: _Model):
    """One layer type's transformers `rope_parameters` for the method (without rope_theta's neighbours)."""
    rope_type = ROPE_TYPES[method]
    params: dict = {"rope_type": rope_type, "rope_theta": theta}
    if method == "ntk":  # NTK-aware scaling is a new base (computed as ropebench's `ntk` computes it)
        params["rope_theta"] = theta * factor ** (dim / (dim - 2))
    elif method == "dynamic-ntk":
        # the "paper" rule s = L'/L is transformers' rule at factor 1
        params["factor"] = factor if options.get("scale_rule", "transformers") == "transformers" else 1.0
    elif method in ("ntk-parts", "yarn", "llama3", "longrope"):
        params.update(factor=factor, original_max_position_embeddings=model.context)
        if method == "llama3":
            params.update(
                low_freq_factor=float(options.get("low_freq_factor", 1.0)),
                high_freq_factor=float(options.get("high_freq_factor", 4.0)),
            )
        elif method == "longrope":
            params.update(
                short_factor=[float(v) for v in options["short_factor"]],
                long_factor=[float(v) for v in options["long_factor"]],
            )
        else:
            params.update(
                beta_fast=float(options.get("beta_fast", 32.0)),
                beta_slow=float(options.get("beta_slow", 1.0)),
            )
        if method == "ntk-parts":
            params["attention_factor"] = 1.0
        elif method != "llama3" and options.get("attention_factor") is not None:
            params["attention_factor"] = float(options["attention_factor"])
    elif method == "proportional":
        params.update(partial_rotary_factor=float(options.get("partial_rotary_factor", 1.0)), factor=factor)
    else:  # pi
        params["factor"] = factor
    return params


def check_setting(method: str, factor, options: dict | None = None) -> tuple[str, float, dict]:
    """The method, factor and options checked as every entry point checks them (registry.check_method)."""
    spec, factor, options = registry.check_method(method, factor, dict(options or {}))
    return spec.name, factor, options


def transformers_updates(method: str, factor: float, options: dict, config) -> tuple[dict, list]:
    """(top-level config keys -> new values, notes) that make transformers compute the method as ropebench's
    patch does. Raises ExportError for what transformers cannot say."""
    if method in LACKS["transformers"] or method not in ROPE_TYPES:
        why = LACKS["transformers"].get(method, "ropebench maps no transformers rope type to it")
        raise _refuse("transformers", method, why)
    model = _model(config, options)
    if isinstance(model, _ScaledModel):
        if method == "plain":
            return {}, []
        raise ExportError(
            f"the model ships scaled RoPE ({'; '.join(model.scaled)}): an engine config holds one rope type "
            f"per layer type, so a method on top of it cannot be written — export from the unscaled model"
        )
    if method == "plain":
        return {}, ["plain: the config is the model's own (no rope change)"]
    notes = []
    rope = copy.deepcopy(dict(config.rope_parameters))
    for lt in model.shipped:
        if lt not in model.extended:
            notes.append(f"layer type {lt} keeps its RoPE (its window never exceeds the trained context)")
            continue
        dim, head_dim = model.dims[lt]
        partial = dim < head_dim
        if method == "proportional" and partial:
            raise ExportError(
                f"transformers' proportional rope type spans head_dim ({head_dim}), this model rotates only "
                f"{dim} dims — ropebench's proportional on partial-rotary models has no transformers form"
            )
        if method == "longrope":
            for name in ("short_factor", "long_factor"):
                values = options.get(name)
                if not isinstance(values, (list, tuple)) or len(values) != dim // 2:
                    raise ExportError(
                        f"longrope {name} must list {dim // 2} numbers (one per rotary pair of this model) — "
                        f"give -o {name}=[...]"
                    )
        own = rope[lt] if lt else rope
        params = _rope_parameters(method, factor, options, float(own["rope_theta"]), dim, model)
        if "partial_rotary_factor" in own and method != "proportional":
            params["partial_rotary_factor"] = own["partial_rotary_factor"]
        if lt:
            rope[lt] = params
        else:
            rope = params
    updates: dict = {"rope_parameters": rope}
    reach = _context(method, factor, options, model.context)
    if method == "dynamic-ntk":
        if int(config.max_position_embeddings) != model.context:
            updates["max_position_embeddings"] = model.context  # transformers' `dynamic` reads L from it
    elif reach and reach > int(config.max_position_embeddings):
        # the length the setting is meant for (transformers checks original_max_position_embeddings below it;
        # vLLM sizes its context from it); no rope type but `dynamic` computes from it
        updates["max_position_embeddings"] = reach
    keeps_context = hasattr(config, "original_max_position_embeddings")
    if ROPE_TYPES[method] in ("yarn", "llama3", "longrope") and keeps_context:
        # Phi-3's config keeps L outside rope_parameters and transformers lets it win over the one inside
        updates["original_max_position_embeddings"] = model.context
    if any(model.shipped):
        notes.append(f"layer types extended: {', '.join(sorted(model.extended))}")
    return updates, notes


def check_config(config, updates: dict) -> None:
    """The config with `updates` as transformers validates it: a family may admit fewer rope types (Phi-3's
    config takes only `default` and `longrope`). Raises ExportError naming what the config refuses."""
    if not updates:
        return
    updated = copy.deepcopy(config)
    try:
        for key, value in updates.items():
            setattr(updated, key, value)
        updated.validate_rope()
    except (ValueError, TypeError) as e:
        cause = getattr(e, "cause", None) or e.__cause__ or e
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[-1].strip()
        raise ExportError(
            f"transformers' {getattr(config, 'model_type', '?')} config refuses the setting "
            f"({first[:200]}) — this family has no transformers form of it"
        ) from None


def temperature_difference(method: str, factor: float, options: dict, config) -> str | None:
    """Where the engines' attention temperature differs from ropebench's setting: transformers, vLLM and
    llama.cpp scale cos/sin (so only the rotary dims of q.k get it); ropebench's default on partial-rotary
    models is every logit (temperature="logits"). None when they agree."""
    model = _model(config, options)
    if isinstance(model, _ScaledModel) or method_attention(method, factor, options, model.context) == 1.0:
        return None
    partial = any(model.dims[lt][0] < model.dims[lt][1] for lt in model.extended)
    temperature = options.get("temperature") or ("logits" if partial else "rotary")
    if temperature != "logits":
        return None
    return (
        f"the engines put {method}'s attention factor on cos/sin (only the rotary dims of q.k get it), the "
        f"measured setting multiplies every logit (temperature='logits', ropebench's default on "
        f"partial-rotary models) — export with -o temperature=rotary to export what the engines compute"
    )


def _context(method: str, factor: float, options: dict, context: int) -> int | None:
    reach = registry.get(method).reach(factor, context, options)
    return int(reach) if math.isfinite(reach) else None


def llama_cpp_form(method: str, factor: float, options: dict, config) -> tuple[list, dict]:
    """(llama.cpp CLI flags, llama-cpp-python keyword arguments). Raises ExportError for what llama.cpp
    cannot say. llama.cpp's YaRN puts its own 1 + 0.1 ln s on cos/sin and multiplies the model's
    `rope.scaling.attn_factor` into it, so an attention factor a other than YaRN's goes there, as
    a / (1 + 0.1 ln s), by a metadata override: `--yarn-attn-factor` is replaced by llama.cpp's own value
    whenever YaRN's ramp is on (llama-context.cpp, llama-cpp-python 0.3.36; measured, docs/export.md)."""
    if method in LACKS["llama.cpp"] or (method not in ROPE_TYPES and method != "ntk"):
        raise _refuse("llama.cpp", method, LACKS["llama.cpp"].get(method, "ropebench maps no flag to it"))
    transformers_updates(method, factor, options, config)  # the same model checks (scaled RoPE, layers)
    model = _model(config, options)
    if isinstance(model, _ScaledModel):  # only `plain` gets here: the model as it ships
        model = model.model
    if any(model.shipped):
        raise ExportError(
            "llama.cpp's rope flags apply to every layer: a model with per-layer-type RoPE (Gemma3, OLMo3) "
            "has no llama.cpp form of a method on some layer types — export to transformers or vllm"
        )
    dim, _ = model.dims[None]
    n_ctx = _context(method, factor, options, model.context) or model.context
    flags, kwargs = [], {"n_ctx": n_ctx}
    if method == "pi":
        flags += ["--rope-scaling", "linear", "--rope-scale", f"{factor:g}"]
        kwargs.update(rope_scaling_type=LLAMA_ROPE_SCALING["linear"], rope_freq_scale=1.0 / factor)
    elif method == "ntk":
        base = float(config.rope_parameters["rope_theta"]) * factor ** (dim / (dim - 2))
        flags += ["--rope-scaling", "none", "--rope-freq-base", repr(base)]
        kwargs.update(rope_scaling_type=LLAMA_ROPE_SCALING["none"], rope_freq_base=base)
    elif method in ("yarn", "ntk-parts"):
        wanted = 1.0 if method == "ntk-parts" else _yarn_attention(factor, options.get("attention_factor"))
        attn = wanted / _yarn_attention(factor, None)
        beta_fast, beta_slow = float(options.get("beta_fast", 32.0)), float(options.get("beta_slow", 1.0))
        flags += [
            "--rope-scaling", "yarn", "--rope-scale", f"{factor:g}", "--yarn-orig-ctx", str(model.context),
            "--yarn-ext-factor", "1",
            "--yarn-beta-fast", f"{beta_fast:g}", "--yarn-beta-slow", f"{beta_slow:g}",
        ]  # fmt: skip
        kwargs.update(
            rope_scaling_type=LLAMA_ROPE_SCALING["yarn"],
            rope_freq_scale=1.0 / factor,
            yarn_orig_ctx=model.context,
            yarn_ext_factor=1.0,
            yarn_beta_fast=beta_fast,
            yarn_beta_slow=beta_slow,
        )
        if attn != 1.0:
            key = f"{gguf_arch(config)}.rope.scaling.attn_factor"
            flags += ["--override-kv", f"{key}=float:{attn!r}"]
            kwargs["kv_overrides"] = {key: attn}
    return ["-c", str(n_ctx), *flags], kwargs


def gguf_arch(config) -> str:
    """The architecture name llama.cpp's GGUF keys start with: the config's model type (what llama.cpp's
    converter writes for Llama, Qwen, Gemma, Phi-3 and most families; a GGUF-loaded config keeps it)."""
    return str(getattr(config, "model_type", None) or "llama")


def plan(engine: str, method: str, factor, options: dict | None, config) -> Export:
    """What exporting the setting to `engine` writes, from the config alone. Raises ExportError (one line) for
    an unknown engine, a method the engine lacks or a model it cannot express it on; ExtendError for a bad
    method, factor or option."""
    if engine not in ENGINES:
        raise ExportError(f"unknown engine {engine!r} — export to one of {', '.join(ENGINES)}")
    if method in LACKS.get(engine, {}):  # named before the options are checked: the engine is the problem
        registry.get(method)
        raise _refuse(engine, method, LACKS[engine][method])
    method, factor, options = check_setting(method, factor, options)
    parity = PARITY.get((engine, method))
    if parity is None:
        raise _refuse(engine, method, "ropebench maps no setting of this engine to it")
    out = Export(engine, method, factor, options, parity)
    if temperature := temperature_difference(method, factor, options, config):
        out.parity = Parity("differs", temperature)
    if engine == "llama.cpp":
        out.flags, out.kwargs = llama_cpp_form(method, factor, options, config)
        out.context = out.kwargs["n_ctx"]
        return out
    out.config_updates, out.notes = transformers_updates(method, factor, options, config)
    check_config(config, out.config_updates)
    model = _model(config, options)
    context = model.model.context if isinstance(model, _ScaledModel) else model.context
    out.context = _context(method, factor, options, context)
    if engine == "vllm":
        out.hf_overrides = copy.deepcopy(out.config_updates)
        for params in _layer_params(out.hf_overrides.get("rope_parameters", {})):
            if params.get("rope_type") == "yarn" and "attention_factor" in params:
                # vLLM's YaRN multiplies its own 0.1 ln s + 1 by `attn_factor` (it reads no attention_factor)
                params["attn_factor"] = params["attention_factor"] / _yarn_attention(params["factor"], None)
        out.kwargs = {"hf_overrides": out.hf_overrides}
        if out.context:
            out.kwargs["max_model_len"] = out.context
    return out


def _layer_params(rope: dict) -> list[dict]:
    return [v for v in rope.values() if isinstance(v, dict)] or ([rope] if rope else [])


def gate(export: Export, allow_mismatch: bool) -> None:
    """Refuse an export whose engine is known to differ from the measured setting, unless allowed."""
    if export.parity.status == "differs" and not allow_mismatch:
        raise ExportError(
            f"{export.engine} is known to differ from the measured {export.method}: {export.parity.detail} "
            f"(pass --allow-mismatch to export it anyway)"
        )
