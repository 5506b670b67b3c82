"""`ropebench export MODEL --method M --factor S --to {transformers,vllm,llama.cpp} [--out D]`: a measured
setting written in the form an engine reads (the mapping: ropebench.extend.export; docs/export.md).

- transformers: a model folder D (config.json with transformers' own `rope_parameters`, the tokenizer files
  copied, the weights symlinked, never copied) that `from_pretrained(D)` loads without ropebench;
- vllm: the `--hf-overrides` JSON and the `LLM(...)` keywords (printed; with --out, also D/export.json);
- llama.cpp: the CLI flags and the llama-cpp-python keywords (printed; with --out, also D/export.json; with
  --gguf-copy, a copy of the .gguf whose metadata carries the setting: extend/export_gguf.py).

Every check (engine, method, factor, options, the output folder, the gate) runs before any weight is read:
bad input is one `error:` line and exit 2. The output folder must be new or empty; it is written in a
temporary sibling and renamed into place, so an existing folder is never overwritten.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from ropebench.extend.flags import add_setting

# Weight files are linked, everything else (config aside) is copied: tokenizers are small.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".index.json")
RECORD = "ropebench-export.json"


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        print(f"error: {message} — run `ropebench export --help`", file=sys.stderr)
        raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="ropebench export",
        description="write a RoPE setting in the form an engine reads (docs/export.md)",
    )
    add_setting(
        p,
        method_help="the RoPE method, e.g. yarn",
        options_example="temperature=rotary",
        method_required=True,
    )
    p.add_argument("--to", required=True, dest="engine", help="transformers, vllm or llama.cpp")
    p.add_argument("--out", help="a new (or empty) folder to write; required for --to transformers")
    p.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="export even where the engine is known to differ from the measured setting",
    )
    p.add_argument(
        "--gguf-copy",
        action="store_true",
        help="--to llama.cpp with a .gguf model: also write into --out a copy of it whose metadata carries "
        "the setting (llama.cpp then needs no rope flag)",
    )
    p.add_argument("--trust-remote-code", action="store_true")
    return p


def check_out(out: str | None, engine: str) -> Path | None:
    """The output folder: absent, or an empty directory. Raises ExportError."""
    from ropebench.extend.export import ExportError

    if out is None:
        if engine == "transformers":
            raise ExportError("--to transformers writes a model folder — give --out D (a new folder)")
        return None
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise ExportError(f"--out {out} is a file — give a new folder")
    if path.is_dir() and any(path.iterdir()):
        raise ExportError(
            f"--out {out} is not empty — give a new folder (an existing one is never overwritten)"
        )
    return path


def parse_options(items: list[str]) -> dict:
    from ropebench.extend.errors import ExtendError
    from ropebench.extend.values import parse_text

    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ExtendError(f"option {item!r} is not KEY=VALUE — e.g. -o beta_fast=16")
        options[key] = parse_text(value, f"-o {key}")
    return options


def source_folder(spec: str) -> Path:
    """The folder whose files the export links or copies: the GGUF snapshot (made once, see
    extend.loading.gguf_snapshot), the local directory, or the hub cache's snapshot."""
    from ropebench.extend import loading

    if spec in loading.ALIASES or spec.endswith(".gguf"):
        path = loading.embedded_gguf(spec) if spec in loading.ALIASES else Path(spec).expanduser()
        return loading.gguf_snapshot(path)
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    return Path(snapshot_download(spec, local_files_only=offline))


def _place(tmp: Path, out: Path) -> None:
    """Rename the finished folder into place: onto nothing or an empty folder, never over files."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private; the export is an ordinary folder
    try:
        os.rename(tmp, out)
    except OSError as e:
        from ropebench.extend.export import ExportError

        raise ExportError(f"could not place the export at {out}: {e.strerror} — give a new folder") from None


def _record(export, spec: str, source: str | None) -> dict:
    from importlib.metadata import version

    return {
        "engine": export.engine,
        "model": spec,
        "source": source,
        "method": export.method,
        "factor": export.factor,
        "options": export.options,
        "parity": {"status": export.parity.status, "detail": export.parity.detail},
        "config_updates": export.config_updates,
        "hf_overrides": export.hf_overrides,
        "flags": export.flags,
        "kwargs": export.kwargs,
        "ropebench": version("ropebench"),
    }


def write_transformers(export, config, source: Path, out: Path, spec: str) -> tuple[list, list]:
    """Write the model folder; (files linked, files copied)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    linked, copied = [], []
    try:
        for key, value in export.config_updates.items():
            setattr(config, key, value)
        config.save_pretrained(tmp)
        for f in sorted(source.iterdir()):
            if f.name in ("config.json", RECORD) or not f.is_file():
                continue
            if f.name.endswith(WEIGHT_SUFFIXES):
                os.symlink(f.resolve(), tmp / f.name)
                linked.append(f.name)
            else:
                shutil.copyfile(f, tmp / f.name)
                copied.append(f.name)
        (tmp / RECORD).write_text(json.dumps(_record(export, spec, str(source)), indent=1) + "\n")
        _place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return linked, copied


def write_record(export, out: Path, spec: str, copy: tuple[Path, str, dict] | None = None) -> None:
    """export.json into the new folder ``out``; with ``copy`` (source GGUF, copy's name, its metadata) also
    the GGUF copy (extend.export_gguf), both in a temporary sibling renamed into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        record = _record(export, spec, None)
        if copy is not None:
            from ropebench.extend.export_gguf import write_copy

            source, name, metadata = copy
            write_copy(source, tmp / name, metadata)
            record["gguf_copy"] = {"file": name, "source": str(source), "metadata": metadata}
        (tmp / "export.json").write_text(json.dumps(record, indent=1) + "\n")
        _place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def gguf_copy_plan(export, spec: str, out: Path | None) -> tuple[Path, str, dict]:
    """(source GGUF, the copy's file name, its metadata) for --gguf-copy, checked before anything is written.
    Raises ExportError / GGUFCopyError."""
    from ropebench.extend import loading
    from ropebench.extend.export import ExportError
    from ropebench.extend.export_gguf import check_copyable, check_source, gguf_metadata

    if export.engine != "llama.cpp":
        raise ExportError("--gguf-copy writes a GGUF for llama.cpp — use it with --to llama.cpp")
    if out is None:
        raise ExportError("--gguf-copy writes a file — give --out D (a new folder)")
    check_copyable(export.kwargs)  # a setting no GGUF can carry: refused before parsing the source (seconds)
    source = loading.embedded_gguf(spec) if spec in loading.ALIASES else Path(spec).expanduser()
    metadata = gguf_metadata(export.kwargs, check_source(source))
    return source, f"{source.stem}.{export.method}-x{export.factor:g}.gguf", metadata


def _model_ref(spec: str, engine: str) -> str:
    """How the engine names the model: llama.cpp a .gguf file, vLLM a folder (a GGUF's snapshot) or hub id."""
    from ropebench.extend import loading

    gguf = spec in loading.ALIASES or spec.endswith(".gguf")
    path = loading.embedded_gguf(spec) if spec in loading.ALIASES else Path(spec).expanduser()
    if engine == "llama.cpp":
        return str(path) if gguf else "MODEL.gguf"
    if gguf:
        snapshot = loading._snapshot_dir(path)
        return str(snapshot) if snapshot.is_dir() else str(path)
    return spec


def describe(export, spec: str) -> list[str]:
    """The lines that say how to run the exported setting in its engine."""
    ref = _model_ref(spec, export.engine)
    if export.engine == "vllm":
        overrides = json.dumps(export.hf_overrides, separators=(",", ":"))
        length = f" --max-model-len {export.context}" if export.context else ""
        kwargs = ", ".join(f"{k}={v!r}" for k, v in export.kwargs.items())
        return [f"vllm serve {ref} --hf-overrides '{overrides}'{length}", f"LLM(model={ref!r}, {kwargs})"]
    if export.engine == "llama.cpp":
        kwargs = ", ".join(f"{k}={v!r}" for k, v in export.kwargs.items())
        lines = [f"llama-cli -m {ref} {' '.join(export.flags)}", f"Llama(model_path={ref!r}, {kwargs})"]
        if ref == "MODEL.gguf":
            lines.append("(convert the model to GGUF first: llama.cpp's convert_hf_to_gguf.py)")
        return lines
    return []


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    from ropebench.extend import export as engines
    from ropebench.extend import loading
    from ropebench.extend.errors import RopebenchError

    try:
        out = check_out(args.out, args.engine)
        if args.engine not in engines.ENGINES:
            known = ", ".join(engines.ENGINES)
            raise engines.ExportError(f"unknown engine {args.engine!r} — use one of {known}")
        options = parse_options(args.option)
        spec = loading.check_model_spec(args.model)
        config = loading.load_config(spec, trust_remote_code=args.trust_remote_code)
        export = engines.plan(args.engine, args.method, args.factor, options, config)
        engines.gate(export, args.allow_mismatch)
        status = f"parity {export.engine}/{export.method}: {export.parity.status} — {export.parity.detail}"
        if export.engine == "transformers":
            source = source_folder(spec)  # a GGUF's snapshot is made here, after every check
            linked, copied = write_transformers(export, config, source, out, spec)
            print(status)
            print(f"wrote {out}: config.json ({json.dumps(export.config_updates)})")
            print(f"  weights linked from {source}: {', '.join(linked) or 'none'}")
            print(f"  copied: {', '.join(copied) or 'none'}")
            print(f"  load it: AutoModelForCausalLM.from_pretrained({str(out)!r})")
        else:
            copy = gguf_copy_plan(export, spec, out) if args.gguf_copy else None
            if out is not None:
                write_record(export, out, spec, copy)
            print(status)
            print("\n".join(describe(export, spec)))
            if out is not None:
                print(f"wrote {out / 'export.json'}")
            if copy is not None:
                print(f"wrote {out / copy[1]}: {json.dumps(copy[2])} (run it with -c {export.context} only)")
        for note in export.notes:
            print(f"note: {note}")
    except RopebenchError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
