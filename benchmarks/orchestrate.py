"""Running the measurements: every child in a fresh subprocess (`ropebench bench run --child NAME ...`,
one JSON line on stdout) so peak-memory figures do not pollute each other; the parent collects what they
return, saves it as JSON and has benchmarks/report.py render the markdown. See figures.py for what each child
measures."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from ropebench.benchmarks import figures, prefix_report, prefix_sharing, report

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MARK = "BENCH_JSON "
# child name -> the function that measures it (figures.py; the prefix-cache child is prefix_sharing.py's)
CHILDREN = {**figures.CHILDREN, "prefix_sharing": prefix_sharing.child_prefix_sharing}


def atomic_write_text(path: Path, text: str) -> None:
    """Whole or not at all. The package's own reports (benchmarks/BENCHMARKS*.md and their JSON) as ever; a
    file the user named with --out through the guard of every writer (extend/owned_paths.py): written when
    new, replaced only while ropebench wrote it and nobody changed it since."""
    if is_package_file(path):
        from ropebench.results import store  # imports extend, hence torch: only once a file is written

        store.atomic_write_text(path, text)
        return
    from ropebench.benchmarks.errors import BenchmarkError
    from ropebench.extend.owned_paths import write_loose_file

    write_loose_file(path, text, "--out", BenchmarkError)


def is_package_file(path: Path) -> bool:
    return HERE.resolve() in Path(path).resolve().parents


# --- child side -----------------------------------------------------------------------------------


def child_main(args) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = CHILDREN[args.child](
        model_dir=args.model_dir,
        lengths=args.lengths,
        window=args.window,
        rolling_tokens=args.rolling_tokens,
        passkey_length=args.passkey_length,
        repeat_index=args.repeat_index,
        dtype=args.dtype,
        prefix=json.loads(args.prefix_json) if args.prefix_json else None,
    )
    print(MARK + json.dumps(out), flush=True)


# --- plan -----------------------------------------------------------------------------------------


def forward_seconds(length: int) -> float:
    """fp32 forward of SmolLM2-135M on this 2-core CPU, fitted to 8k ~26 s and 16k ~80 s (linear plus
    quadratic term)."""
    x = length / 8192
    return 12 * x + 14 * x * x


def prefix_options(args) -> dict:
    return {
        "length": args.prefix_length,
        "queries": args.prefix_queries,
        "trials": args.prefix_trials,
        "zero_shot_queries": args.prefix_zero_shot_queries,
    }


def prefix_estimate(args) -> float:
    """The prefix-sharing child: unshared = one fp32 forward per prompt; shared ~ one forward per many-shot
    cell and ~half the passkey grid (the haystack past the needle runs again per depth)."""
    t = 1.3 * forward_seconds(args.prefix_length)  # fp32
    prompts = args.prefix_trials * 5
    return 10 + t * (args.prefix_queries + 2 + 1.5 * prompts + 2 * args.prefix_zero_shot_queries + 2)


def plan(args) -> list[tuple[str, float]]:
    """(child, estimated seconds) for one repeat."""
    load = 10.0  # interpreter + torch/transformers imports + snapshot load + warm-up
    lmax = max(args.lengths)
    windows = -(-max(args.rolling_tokens or 42000, args.window) // (args.window - 1))
    return [
        ("onepass", load + forward_seconds(lmax)),
        ("perlength", load + sum(forward_seconds(n) for n in args.lengths)),
        ("labels", load + 1.1 * forward_seconds(lmax)),
        ("bare", load + 3.2 * forward_seconds(lmax)),
        ("otherdtype", load + forward_seconds(lmax)),
        ("rolling_ropebench", load + windows * forward_seconds(args.window)),
        ("rolling_lmeval", load + windows * forward_seconds(args.window)),
        ("passkey", load + 2.2 * forward_seconds(args.passkey_length)),
        ("prefix_sharing", prefix_estimate(args)),
    ]


def total_estimate(args) -> float:
    """Seconds for the whole run: the prefix-sharing child runs min(--repeats, --prefix-repeats) times."""
    return args.repeats * sum(s for n, s in plan(args) if n != "prefix_sharing") + min(
        args.repeats, args.prefix_repeats
    ) * prefix_estimate(args)


# --- parent side ----------------------------------------------------------------------------------


def spawn(args, name: str, repeat: int, *, prefix: dict | None = None) -> dict:
    # ropebench.benchmarks: found from cwd=ROOT whether or not ropebench is installed
    cmd = [sys.executable, "-m", "ropebench.benchmarks", "run", "--child", name]
    cmd += ["--model-dir", str(args.model_dir), "--lengths", *map(str, args.lengths)]
    cmd += ["--window", str(args.window), "--rolling-tokens", str(args.rolling_tokens)]
    cmd += ["--passkey-length", str(args.passkey_length), "--repeat-index", str(repeat)]
    cmd += ["--dtype", args.prefix_dtype if name == "prefix_sharing" else args.dtype]
    cmd += ["--prefix-json", json.dumps(prefix if prefix is not None else prefix_options(args))]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith(MARK)]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"benchmark child {name!r} failed (exit {proc.returncode}) — see its stderr above")
    out = json.loads(lines[-1][len(MARK) :])
    out["child_wall"] = time.perf_counter() - t0
    return out


def prefix_groups(args) -> list[tuple[str, ...]]:
    """The parts (prefix_sharing.PARTS) each prefix-sharing child runs: one child per part, so a long run
    keeps every part that finished; --quick runs them all in one child (a quick part takes seconds, less than
    a child's start: ~10 s of imports)."""
    return [prefix_sharing.PARTS] if args.quick else [(part,) for part in prefix_sharing.PARTS]


def spawn_prefix(args, repeat: int, saved=lambda run: None) -> dict:
    """The prefix-sharing measurements of one repeat, a child per group of parts (`prefix_groups`), merged
    into one run; `saved(run)` after each child, so a long run keeps every part that finished."""
    run, t0 = {}, time.perf_counter()
    for parts in prefix_groups(args):
        t, name = time.perf_counter(), " + ".join(parts)
        out = spawn(args, "prefix_sharing", repeat, prefix={**prefix_options(args), "parts": list(parts)})
        run.update({k: v for k, v in out.items() if k != "child_wall"})
        run.setdefault("part_seconds", {})[name] = time.perf_counter() - t
        saved(run)
        print(f"    prefix sharing, {name}: {time.perf_counter() - t:.0f} s", flush=True)
    run["child_wall"] = time.perf_counter() - t0
    return run


def model_snapshot(args) -> Path:
    """extend.load's cached snapshot of the embedded GGUF (made once, in a child): every child loads it in a
    second instead of parsing the GGUF file three times."""
    return Path(spawn(args, "snapshot", 0)["model_dir"])


def machine() -> dict:
    cpu = "unknown"
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = re.search(r"^model name\s*:\s*(.+)$", info, re.MULTILINE).group(1).strip()
        flags = re.search(r"^flags\s*:\s*(.+)$", info, re.MULTILINE).group(1).split()
        bf16 = "avx512_bf16" in flags
    except (OSError, AttributeError):
        bf16 = False
    ram = None
    try:
        ram = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) * 1024
    except (OSError, AttributeError):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram": ram,
        "avx512_bf16": bf16,
        "os": platform.platform(),
        "load": os.getloadavg(),
    }


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "lm_eval", "ropebench"):
        try:
            out[name] = md.version(name.replace("_", "-"))
        except md.PackageNotFoundError:
            out[name] = "not installed"
    return out


def started(command: str) -> dict:
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(),
        "command": command,
    }


def save_json(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=1, default=str))


def write_report(path: Path, text: str) -> None:
    """Atomically; what the previous report holds that this run does not produce is kept (report.py says
    what)."""
    previous = path.read_text() if path.is_file() else ""
    atomic_write_text(path, report.keep_from_previous(previous, text))


def run_all(args, out: Path, command: str) -> None:
    """Every child, --repeats times; the raw measurements are saved before the report is rendered, so a failed
    rendering can be redone with --from-json."""
    print(
        f"ropebench benchmark: lengths {args.lengths}, window {args.window}, passkey {args.passkey_length}, "
        f"{args.repeats} repeat(s); estimated {total_estimate(args) / 60:.1f} min on a quiet 2-core CPU",
        flush=True,
    )
    data = {**started(command), "estimate_seconds": total_estimate(args), "model_given": args.model_dir}
    args.model_dir = args.model_dir or model_snapshot(args)
    runs = []
    t_start = time.perf_counter()
    for r in range(args.repeats):
        rep = {}
        for name, est in plan(args):
            if name == "prefix_sharing" and r >= args.prefix_repeats:  # long: its own repeat count
                continue
            t0 = time.perf_counter()
            rep[name] = spawn_prefix(args, r) if name == "prefix_sharing" else spawn(args, name, r)
            print(
                f"  repeat {r + 1}/{args.repeats} {name:18s} {time.perf_counter() - t0:7.1f} s "
                f"(est. {est:.0f} s)",
                flush=True,
            )
        runs.append(rep)
    data.update(
        runs=runs,
        total_seconds=time.perf_counter() - t_start,
        args={k: str(x) if isinstance(x, Path) else x for k, x in vars(args).items()},
    )
    saved = out.with_suffix(".json")
    save_json(saved, data)
    rows, checks = report.figure_rows(data)
    write_report(out, report.render(data, notes_text(args.notes)))
    save_json(saved, {**data, "rows": rows, "checks": checks})
    print(f"wrote {out}")
    for r in rows:
        print(f"  {r['met']:7s} {r['ratio']:>7s}  {r['figure'][:90]}")


def run_prefix_only(args, out: Path, command: str) -> None:
    """`--only prefix-sharing`: the prefix-cache child alone; its section replaces the previous one in the
    report (everything else in it stays), with the perplexity targets restated from the saved full run."""
    print(
        f"ropebench benchmark, prefix sharing only: {prefix_options(args)}, {args.prefix_dtype}, "
        f"{args.repeats} repeat(s); estimated {args.repeats * prefix_estimate(args) / 60:.1f} min on a quiet "
        "2-core CPU",
        flush=True,
    )
    args.model_dir = args.model_dir or model_snapshot(args)
    data = {
        **started(command),
        "dtype": args.prefix_dtype,
        "options": prefix_options(args),
        "runs": [],
        "complete": False,
    }
    saved = out.with_name("BENCHMARKS.prefix.json")
    for r in range(args.repeats):
        t0 = time.perf_counter()
        run = spawn_prefix(
            args, r, lambda part_run: save_json(saved, {**data, "runs": data["runs"] + [part_run]})
        )
        data["runs"].append(run)
        print(f"  repeat {r + 1}/{args.repeats} prefix_sharing {time.perf_counter() - t0:7.1f} s", flush=True)
    data["complete"] = True
    save_json(saved, data)
    full_path = out.with_suffix(".json")
    full = json.loads(full_path.read_text()) if full_path.is_file() else None
    previous = out.read_text() if out.is_file() else "# ropebench benchmarks\n"
    atomic_write_text(out, prefix_report.splice(previous, prefix_report.section(data, full)))
    print(f"wrote {out} (section) and {saved}")
    for row in prefix_report.rows(data["runs"])[0]:
        ratio = "—" if row["ratio"] is None else f"{row['ratio']:.3f}"
        print(f"  {'yes' if row['met'] else 'NO':4s} {ratio:>7s}  {row['figure'][:100]}")


def notes_text(path) -> str | None:
    return Path(path).read_text() if path and Path(path).is_file() else None
