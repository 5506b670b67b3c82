"""Cost bounds of the task options that set the size of a search, a sample or a tensor.

A size is checked against the work it starts, not only against a pool: a value the pool allows can still
run for hours or grow past the memory before any model loads (retrieval `candidates` just under its pool's
limit drew millions of wrong answers). Each size option's check is `at_most(BOUND, what one unit costs)`:
a positive integer no larger than the bound, refused before the model loads with the bound in the message
(tests/project/test_bad_inputs_sizes.py checks that every integer option of every task has one, and that a
run at the bound finishes or is refused within seconds). A list option's length is bounded the same way
(`MAX_DEPTHS`).
"""

from __future__ import annotations

from .kit import Check, positive

# Each bound and what one unit of it costs (the message names both): the work at the bound is hours of a
# model's forwards, not more; what is checked before the model loads stays within seconds
MAX_TRIALS, TRIAL_COST = 10_000, "each trial is one prompt of the full length per depth and length"
MAX_CANDIDATES, CANDIDATE_COST = 1_000, "each candidate is one more forward of an answer on every prompt"
MAX_HAYSTACKS, HAYSTACK_COST = 1_000, "each haystack is one more prefill of the full length"
MAX_NEW_TOKENS, NEW_TOKEN_COST = 4_096, "each token is one more decoding step of every prompt"
MAX_DOCS, DOC_COST = 100_000, "each document is one more forward of the full length"
# the logits of one LM-head call are chunk_size x vocab floats; the memory check counts 1024
# (extend.memory.LOGIT_CHUNK)
MAX_CHUNK, CHUNK_COST = 8_192, "logits of chunk_size x vocabulary floats at once: 1.6 GB at 8192 x 49k"
MAX_TOKENS, TOKEN_COST = 1 << 20, "tokens held in one forward"
MAX_DEPTHS, DEPTH_COST = 101, "each depth is one more prompt per trial and length"


def at_most(bound: int, cost: str) -> Check:
    """A positive integer no larger than `bound`, the option's cost bound (`cost`: what one unit costs),
    e.g. "must be at most 1000, its cost bound (each one more forward per prompt) — use 1 to 1000"."""

    def check(value) -> str | None:
        problem = positive(value)
        if problem is not None or value <= bound:
            return problem
        return f"is over its cost bound {bound} ({cost}) — use 1 to {bound}"

    check.bound = bound
    return check


def at_most_or_none(bound: int, cost: str) -> Check:
    """`at_most`, or unset (None: the task's default rule)."""
    inner = at_most(bound, cost)

    def check(value) -> str | None:
        return None if value is None else inner(value)

    check.bound = bound
    return check


def bounded_list(check: Check, bound: int, cost: str) -> Check:
    """`check` on a list option whose length is also bounded (a scalar counts as one)."""

    def bounded(value) -> str | None:
        if isinstance(value, (list, tuple)) and len(value) > bound:
            return f"holds {len(value)} values, over its cost bound {bound} ({cost}) — give at most {bound}"
        return check(value)

    bounded.bound = bound
    return bounded


# retrieval's likelihood scoring: every prompt scores its true answer and each candidate; every scene's
# answers are drawn and tokenized before the model loads too (the length check), so this bounds both
MAX_ANSWERS = 100_000
ANSWER_COST = "each answer is one forward on its prompt's cache, drawn and tokenized before the model loads"


def answers_problem(prompts: int, candidates: int) -> str | None:
    """What is wrong with `prompts` prompts per length, each scoring 1 + `candidates` answers (None: within
    MAX_ANSWERS). The advice names a smaller value than the one given, never the same."""
    total = prompts * (1 + candidates)
    if total <= MAX_ANSWERS:
        return None
    most = MAX_ANSWERS // prompts - 1
    if most >= 1:
        hint = f"use candidates <= {most}"
    else:
        most_prompts = MAX_ANSWERS // (1 + candidates)
        hint = f"use fewer trials, depths or variants (at most {most_prompts} prompts per length)"
    return (
        f"options give {prompts} prompts per length, each scoring 1 + candidates={candidates} answers: "
        f"{total}, over the cost bound {MAX_ANSWERS} ({ANSWER_COST}) — {hint}"
    )


def length_example(need: int, usual: int) -> int:
    """An example length above `need` for a message: `usual`, or the next power of two when `usual` is not
    above it (so the advice never names the too-short length the user gave)."""
    return usual if usual > need else 1 << need.bit_length()
