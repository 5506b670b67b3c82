"""A llama.cpp export as GGUF metadata: the keys llama.cpp's loader reads (llama-model.cpp, `load_hparams`)
that carry the setting, and a copy of a GGUF file with them, so `llama-cli -m COPY.gguf` runs the setting
with no rope flag. The copy is gguf's own `copy_with_new_metadata` (the `gguf-new-metadata` script): every
other key and every tensor byte as in the source.

What the metadata cannot say is refused (ExportError, before anything is written): YaRN's beta_fast and
beta_slow other than llama.cpp's defaults (32, 1; the loader reads no key for them: use the flags), and
`plain` (the source file already is the setting).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .errors import ExtendError

# llama.cpp's defaults for the YaRN ramp when no flag gives one (llama-hparams.h)
YARN_BETA_DEFAULTS = {"yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0}
SCALING_TYPES = {0: "none", 1: "linear", 2: "yarn"}  # llama_rope_scaling_type -> the key's string


class GGUFCopyError(ExtendError):
    """A setting the GGUF metadata cannot carry, or a source that is not a GGUF file."""


def check_copyable(kwargs: dict) -> str:
    """The GGUF scaling type of a llama.cpp export's keywords (export.kwargs); GGUFCopyError when a GGUF file
    cannot carry the setting. Reads no file: a copy is refused before its source is parsed."""
    for key, default in YARN_BETA_DEFAULTS.items():
        if key in kwargs and float(kwargs[key]) != default:
            raise GGUFCopyError(
                f"a GGUF file carries no YaRN {key.removeprefix('yarn_')} (llama.cpp reads none from it; "
                f"its default is {default:g}) — run the setting with the printed flags instead"
            )
    scaling = SCALING_TYPES.get(kwargs.get("rope_scaling_type"))
    if scaling is None or (scaling == "none" and "rope_freq_base" not in kwargs):
        raise GGUFCopyError("plain needs no copy: the GGUF file already runs it — pass --method M")
    return scaling


def gguf_metadata(kwargs: dict, arch: str) -> dict[str, float | int | str]:
    """{GGUF key: value} for a llama.cpp export's llama-cpp-python keywords (export.kwargs). The attention
    factor goes to `rope.scaling.attn_factor`, which llama.cpp multiplies into YaRN's own 0.1 ln s + 1."""
    out: dict[str, float | int | str] = {
        f"{arch}.context_length": int(kwargs["n_ctx"]),
        f"{arch}.rope.scaling.type": check_copyable(kwargs),
    }
    if "rope_freq_base" in kwargs:
        out[f"{arch}.rope.freq_base"] = float(kwargs["rope_freq_base"])
    if "rope_freq_scale" in kwargs:
        out[f"{arch}.rope.scaling.factor"] = 1.0 / float(kwargs["rope_freq_scale"])
    if "yarn_orig_ctx" in kwargs:
        out[f"{arch}.rope.scaling.original_context_length"] = int(kwargs["yarn_orig_ctx"])
    attention = (kwargs.get("kv_overrides") or {}).get(f"{arch}.rope.scaling.attn_factor")
    if attention is not None:
        out[f"{arch}.rope.scaling.attn_factor"] = float(attention)
    return out


def check_source(path: Path, reader=None) -> str:
    """The source GGUF's architecture (`general.architecture`); GGUFCopyError for anything else. `reader`: a
    gguf.GGUFReader of it already made (parsing a large vocabulary's metadata takes seconds)."""
    import gguf

    if not path.is_file() or path.suffix != ".gguf":
        raise GGUFCopyError(f"--gguf-copy needs a .gguf model file, not {path} — pass the model's .gguf")
    try:
        field = (reader or gguf.GGUFReader(path, "r")).get_field(gguf.Keys.General.ARCHITECTURE)
    except (OSError, ValueError) as e:
        raise GGUFCopyError(f"{path} is not a readable GGUF file ({e}) — pass the model's .gguf") from None
    if field is None:
        raise GGUFCopyError(f"{path} names no general.architecture — pass a GGUF made by llama.cpp's tools")
    return str(field.contents())


def write_copy(source: Path, dest: Path, metadata: dict[str, float | int | str]) -> None:
    """Copy ``source`` to ``dest`` (a new file) with ``metadata`` set: gguf's copy_with_new_metadata. Keys the
    source has keep their type; new ones get GGUF's type for the Python value (float32, uint32, string)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(source, "r")
    types = {
        float: gguf.GGUFValueType.FLOAT32,
        int: gguf.GGUFValueType.UINT32,
        str: gguf.GGUFValueType.STRING,
    }
    details = {}
    for key, value in metadata.items():
        field = reader.get_field(key)
        kind = field.types[0] if field is not None else types[type(value)]
        details[key] = MetadataDetails(kind, value)
    writer = gguf.GGUFWriter(dest, arch=check_source(source, reader), endianess=reader.endianess)
    alignment = reader.get_field(gguf.Keys.General.ALIGNMENT)
    if alignment is not None:
        writer.data_alignment = alignment.contents()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):  # the copy's own progress bar
        copy_with_new_metadata(reader, writer, details, [])
