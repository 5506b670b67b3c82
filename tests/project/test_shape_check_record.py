"""The README's shape check, read from its stored records (benchmarks/shape_check.<dtype>.json, written by
`ropebench bench shape-check --json`; the README's table is generated from them): the shape the README states
in words holds on the numbers it shows. Expected (the brief, at 16k, factor 2, no fine-tuning, a model trained
on 8k): plain breaks past the trained context, pi pays everywhere, ntk / dynamic-ntk / yarn stay flat, and the
position-remapping methods keep plain's first 4k and stay flat."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FLAT = 0.2  # nats/token: "stays flat" from the first to the last 4k (plain rises by ~3)
# the options the README names for them ("self-extend: window 1024, group 3; leaky rerope: window 1024; dca:
# chunk 6144, local window 512")
REMAPPED = {
    "self-extend": {"window": 1024, "group": 3},
    "rerope": {"window": 1024, "leaky": True},
    "dca": {"chunk_size": 6144, "local_window": 512},
}


def rows(dtype: str) -> dict[str, dict]:
    record = json.loads((ROOT / "benchmarks" / f"shape_check.{dtype}.json").read_text())
    assert record["dtype"] == dtype and record["tokens"] == 16384
    return {row["method"]: row for row in record["rows"]}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_frequency_methods_have_the_expected_shape(dtype):
    got = rows(dtype)
    plain = got["plain"]
    assert plain["last4k"] - plain["first4k"] > 2  # breaks past 8k
    assert got["pi"]["first4k"] - plain["first4k"] > 0.5  # pays everywhere, inside the trained context too
    for method in ("pi", "ntk", "dynamic-ntk", "yarn"):
        assert got[method]["last4k"] - got[method]["first4k"] < FLAT, method
    for method in ("ntk", "dynamic-ntk", "yarn"):  # near plain where plain works
        assert abs(got[method]["first4k"] - plain["first4k"]) < 0.1, method


def test_the_remapping_methods_keep_plains_first_4k_and_stay_flat():
    """README: 'keep the first 4k within 0.002 nats of plain and stay flat past 8k, slightly below YaRN'."""
    got = rows("float32")
    for method, options in REMAPPED.items():
        assert options.items() <= got[method]["options"].items(), method
        assert abs(got[method]["first4k"] - got["plain"]["first4k"]) <= 0.002, method
        assert got[method]["last4k"] - got[method]["first4k"] < FLAT, method
        assert got[method]["last4k"] < got["yarn"]["last4k"], method


@pytest.mark.real
def test_the_command_writes_the_record_the_table_is_made_from(tmp_path, monkeypatch):
    """`bench shape-check --json` on the embedded model (the 16k forwards replaced by a known loss curve: the
    forward itself is what the tasks' tests check): one row per --methods entry, the means of the first and
    last 4096 token losses, the patch's options, and the date and machine the README's table cites."""
    import torch
    from ropebench.benchmarks import shape_check
    from ropebench.tasks import scoring

    monkeypatch.setattr(scoring, "token_nll", lambda model, ids, **kw: torch.arange(len(ids) - 1.0) / 1e4)
    out = tmp_path / "shape.json"
    assert shape_check.main(["--dtype", "float32", "--methods", "plain", "dca:1", "--json", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["dtype"] == "float32" and record["tokens"] == 16384
    assert {"date", "machine", "versions", "command"} <= record.keys()
    assert [(r["method"], r["factor"]) for r in record["rows"]] == [("plain", 2.0), ("dca", 1.0)]
    row = record["rows"][1]
    assert row["first4k"] == pytest.approx(2047.5 / 1e4) and row["last4k"] == pytest.approx(14334.5 / 1e4)
    assert row["options"]["chunk_size"] == 6144
