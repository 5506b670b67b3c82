"""RULER's variable tracking as lm-eval 0.4.13 writes it (tasks/ruler/vt_utils.py), for the retrieval task's
`vt` variant: the chain, lm-eval vt's join of chain and noise, and its in-context example.

lm-eval's `ruler_vt` prompt opens with an in-context example: a vt prompt of its own (3-letter names, drawn at
500 tokens in 5-block steps, sized like the main prompt but without an example) with its answer, its names
renamed (`randomize_icl`: each replaced, in order, by 3 new random letters wherever it stands), two blank
lines, then the question. lm-eval sizes the noise (10-block steps) with the example counted: the input with
its answer prefix and the answer as Python prints the list (" ['ABCDE', ...]"), plus the example's tokens as
drawn (before the renaming), plus tokens_to_generate (30), at most the length. `example_text` writes the
example; `sized_text` the text the main prompt's size is counted on.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass

from .common import interleave
from .kit import largest_fitting

# RULER's repeat haystack (the noise blocks of vt and of the noise-haystack needle tasks)
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
VT_TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
VT_ANSWER = (
    "Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assgined the value {query}, they are:"
)  # RULER's spelling, kept: the prompt is RULER's
GENERATE = 30  # lm-eval vt's tokens_to_generate
# lm-eval vt's in-context example: drawn at this length, in steps of this many blocks, names of 3 letters
EXAMPLE_LENGTH, EXAMPLE_STEP, EXAMPLE_LETTERS = 500, 5, 3


def variable(rng: random.Random, letters: int = 5) -> str:
    """A variable name (RULER vt's: 5 upper-case letters; its example's: 3)."""
    return "".join(rng.choices(string.ascii_uppercase, k=letters))


def chain_of(names, value: str) -> list[str]:
    """lm-eval vt's chain (generate_chains): the value, then each variable set to the one before."""
    return [f"VAR {names[0]} = {value}"] + [
        f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(len(names) - 1)
    ]


def vt_context(blocks: list[str], needles: list[str], at: list[int]) -> str:
    """lm-eval vt's join: each block ends in a newline, needle k (in order) stands after `at[k]` blocks, all
    joined with spaces, ". \\n" made ".\\n"."""
    return " ".join(interleave([block + "\n" for block in blocks], needles, at)).replace(". \n", ".\n")


def lm_eval_input(context: str, value: str, num_v: int) -> str:
    """lm-eval vt's input_text: the template with the context, and its answer prefix with the spaces around
    it (" Answer: ... they are: ")."""
    question = VT_TEMPLATE.replace("{query}", value).replace("{context}", context)
    return f"{question} {VT_ANSWER.format(num_v=num_v, query=value)} "


def sized_text(user: str, answer_prefix: str, names) -> str:
    """The text lm-eval vt counts to size a prompt: the input (user text, a space, the answer prefix and its
    trailing space) and f" {answer}" with the answer the list of names, as Python prints it (two spaces)."""
    return f"{user} {answer_prefix}  {list(names)}"


@dataclass(frozen=True)
class Example:
    """The draws of one in-context example: its names (as drawn: what lm-eval's sizing counts), the names
    shown instead (randomize_icl's), its value and the seed of its chain's positions among the blocks (`at`:
    given positions instead, e.g. lm-eval's)."""

    names: tuple[str, ...]
    shown: tuple[str, ...]
    value: str
    seed: int
    at: tuple[int, ...] = ()


def draw_example(rng: random.Random, hops: int) -> Example:
    names: list[str] = []
    while len(names) < hops + 1:  # distinct, as lm-eval's generate_chains
        name = variable(rng, EXAMPLE_LETTERS)
        if name not in names:
            names.append(name)
    value = str(rng.randint(10000, 99998))  # numpy's randint(10000, 99999): the upper end excluded
    shown = tuple(variable(rng, EXAMPLE_LETTERS) for _ in names)
    return Example(tuple(names), shown, value, rng.randrange(2**31))


def _drawn_text(example: Example, blocks: int) -> str:
    """The example's input on `blocks` noise blocks, its chain at positions drawn from its seed (lm-eval:
    sorted random positions among the blocks)."""
    at = list(example.at) or sorted(random.Random(example.seed).sample(range(blocks), len(example.names)))
    context = vt_context([NOISE] * blocks, chain_of(example.names, example.value), at)
    return lm_eval_input(context, example.value, len(example.names))


def example_blocks(example: Example, count: Callable[[str], int]) -> int:
    """lm-eval's noise blocks of the example: the most 5-block steps whose input with its answer (as Python
    prints the list), plus GENERATE, is at most EXAMPLE_LENGTH tokens (`count`: text -> tokens)."""

    def size(steps: int) -> int:
        blocks = steps * EXAMPLE_STEP
        if blocks < len(example.names):  # fewer blocks than chain items: lm-eval splits sentences; not needed
            return 0
        return count(_drawn_text(example, blocks) + f" {list(example.names)}")

    return (
        max(1, largest_fitting(size, EXAMPLE_LENGTH // EXAMPLE_STEP, EXAMPLE_LENGTH - GENERATE))
        * EXAMPLE_STEP
    )


def example_text(example: Example, count: Callable[[str], int]) -> tuple[str, int]:
    """(the text before the question, the tokens lm-eval counts for it): the example as drawn with its answer
    and two newlines, its names renamed in order wherever they stand (randomize_icl's str.replace), then two
    more newlines; lm-eval counts the example as drawn, before the renaming."""
    drawn = _drawn_text(example, example_blocks(example, count)) + " " + " ".join(example.names) + "\n\n"
    shown = drawn
    for name, new in zip(example.names, example.shown, strict=True):
        shown = shown.replace(name, new)
    return shown + "\n\n", count(drawn)
