"""EleutherAI lm-evaluation-harness (0.4.x) integration: any lm-eval task on a RoPE-patched model.

    ropebench lm-eval run --model ropebench \\
        --model_args pretrained=smollm2-135m,method=yarn,factor=2 --tasks ropebench_passkey_16k --limit 4
    ropebench lm-eval tasks          # prints the folder of ropebench's own lm-eval tasks
    (`python -m ropebench.integrations.lm_eval ...`: the same CLI without ropebench's task folder: the
    `ropebench` command passes it, `main(argv, tasks_dir=...)`)

- `RopebenchLM` (registered as lm-eval model ``ropebench``): an `HFLM` that loads through `extend.load`
  and patches the model with `extend.patch(model, method, factor, **options)`. `max_length` defaults to
  factor x the trained context (stock HFLM would cut inputs from the left at max_position_embeddings).
  Loglikelihood requests (and so rolling perplexity) run the decoder body once and the LM head only on the
  scored positions, SCORE_BLOCK at a time: a 32k window never holds (32k x vocab) logits.
- lm-eval 0.4.13 has no plugin discovery for models, hence the CLI shim `main()`: it registers the model,
  checks ropebench model_args up front (one `error: ...` line, exit 2) and runs lm-eval's own CLI. Offline,
  tasks whose data is neither cached nor local are refused before the model loads (`unreachable_data`).
- The scoring and generation overrides follow HFLM's private loop pieces; on an lm-eval outside
  `LM_EVAL_RANGE` the model keeps stock HFLM's loops (one warning) and still patches RoPE.

An integration, above the layers (it may use extend, tasks and results; none of them imports it): the
model and its model_args (model.py), the data its tasks read, checked before the model loads (data.py),
and the CLI shim (cli.py). Importing `extend` never imports it (lm-eval is slow to import).
"""

from .cli import main
from .model import LM_EVAL_RANGE, MODEL_NAME, RopebenchLM, check_model_args, tokenizer_source

__all__ = ["LM_EVAL_RANGE", "MODEL_NAME", "RopebenchLM", "check_model_args", "main", "tokenizer_source"]
