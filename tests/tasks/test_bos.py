"""BOS follows the tokenizer's own encoding (issue 12, item 3): `special_prefix`, and what perplexity
records."""

import pytest
from ropebench.tasks import TaskError, perplexity
from ropebench.tasks.common import prefix_options, special_prefix


def llama_style_tokenizer():
    """A tokenizer whose own encoding puts <s> first (as Llama's), built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "The": 3, "grass": 4, "is": 5, "green.": 6}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def test_special_prefix_follows_the_tokenizer(smollm2_tokenizer):
    llama = llama_style_tokenizer()
    assert special_prefix(llama) == [1] and special_prefix(llama, add_bos=True) == [1]
    assert special_prefix(llama, add_bos=False) == []
    # SmolLM2: bos_token <|im_start|> (id 1) exists, but its own encoding adds nothing
    assert smollm2_tokenizer.bos_token_id == 1
    assert special_prefix(smollm2_tokenizer) == [] and special_prefix(smollm2_tokenizer, add_bos=False) == []
    assert special_prefix(smollm2_tokenizer, add_bos=True) == [1]
    assert prefix_options(llama, [1]) == {"add_bos": True, "prefix_ids": [1], "bos_setting": "tokenizer"}
    assert prefix_options(smollm2_tokenizer, [], False)["bos_setting"] is False
    with pytest.raises(TaskError, match="add_bos must be"):
        special_prefix(llama, add_bos="yes")


def test_perplexity_records_what_was_used(smollm2_tokenizer, tiny_llama_factory):
    tok = smollm2_tokenizer
    model = tiny_llama_factory(max_position_embeddings=256, vocab_size=len(tok))
    default = [
        r for r in perplexity.run(model, tok, lengths=[64], num_docs=1, progress=False) if r["doc"] is None
    ]
    forced = [
        r
        for r in perplexity.run(model, tok, lengths=[64], num_docs=1, add_bos=True, progress=False)
        if r["doc"] is None
    ]
    assert default[0]["task_options"]["add_bos"] is False and default[0]["task_options"]["prefix_ids"] == []
    assert forced[0]["task_options"]["add_bos"] is True and forced[0]["task_options"]["prefix_ids"] == [1]
    assert default[0]["n"] == forced[0]["n"] == 63  # a window scores L - 1 tokens either way
    assert default[0]["value"] != forced[0]["value"]
