"""Run by tests/extend/test_export.py as `python -I -S export_child.py JOBS.json`: a Python that cannot import
ropebench (isolated mode, no site processing, no editable install (.pth); sys.path is the standard library
plus the site-packages folders the test passes, which hold no ropebench package). It proves that first, then
loads each exported folder with plain transformers and saves what the test compares with ropebench's patch:
logits on the job's prompt, then (after: transformers' `dynamic` keeps the longest length it has run) the
rotary module's cos/sin, inverse frequencies and attention scaling at positions (0, 1, seq_len - 1)."""

import importlib.util
import json
import sys

jobs_file = sys.argv[1]
with open(jobs_file) as f:
    spec = json.load(f)
sys.path.extend(spec["site_packages"])
checkout = spec["checkout"]
# neither the installed name nor the checkout's folders (the checkout itself is not on the path)
if any(importlib.util.find_spec(name) is not None for name in ("ropebench", "extend", "scripts")) or any(
    p.rstrip("/") == checkout for p in sys.path
):
    sys.exit(f"ropebench is importable here: sys.path={sys.path}")
try:
    import ropebench  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    sys.exit("import ropebench succeeded")

import torch
from transformers import AutoModelForCausalLM

results = {}
for job in spec["jobs"]:
    model = AutoModelForCausalLM.from_pretrained(
        job["dir"], dtype=torch.float32, attn_implementation=job["attention"]
    )
    model.eval()
    out = {}
    with torch.no_grad():
        out["logits"] = model(torch.tensor([job["prompt"]])).logits
        rotary = model.base_model.rotary_emb
        positions = torch.tensor([[0, 1, job["seq_len"] - 1]])
        x = torch.zeros(1, 3, 8)
        for layer_type in job["layer_types"]:
            prefix = f"{layer_type}_" if layer_type else ""
            args = (layer_type,) if layer_type else ()
            cos, sin = rotary(x, positions, *args)
            out[layer_type] = {
                "cos": cos,
                "sin": sin,
                "inv_freq": getattr(rotary, f"{prefix}inv_freq").clone(),
                "scaling": float(getattr(rotary, f"{prefix}attention_scaling")),
            }
    results[job["name"]] = out
torch.save(
    {"results": results, "ropebench_importable": importlib.util.find_spec("ropebench") is not None},
    spec["out"],
)
