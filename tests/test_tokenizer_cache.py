"""kvcost.models.decoders.cached_tokenizer: a decoder's tokenizer is converted from its GGUF once and loaded
from the saved copy after (the conversion is most of a Gemma process's start-up), only where the copy encodes
the probe text the same."""
import pytest

from kvcost.models import decoders

# transformers is the real-decoder extra (make real-model), not a test dependency: without it there is no
# tokenizer to cache
pytest.importorskip("transformers", reason="the real-decoder extra (make real-model) is not installed")


def _tiny():
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "the": 3, "cat": 4, "sat": 5, ".": 6}
    t = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=t, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>")


def test_a_tokenizer_is_converted_once(tmp_path):
    calls = []

    def convert():
        calls.append(1)
        return _tiny()

    where = tmp_path / "tokenizers" / "tiny-0123-transformers-x"
    first = decoders.cached_tokenizer(convert, where, "the cat sat .")
    assert calls == [1] and where.is_dir() and (where / "tokenizer.json").is_file()
    again = decoders.cached_tokenizer(convert, where, "the cat sat .")
    assert calls == [1]                                              # loaded from the saved copy
    for tok in (first, again):
        assert tok("the cat sat . dog", add_special_tokens=False)["input_ids"] == [3, 4, 5, 6, 0]
        assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert [p.name for p in where.parent.iterdir()] == [where.name]  # no partial copy left beside it


def test_a_copy_that_encodes_differently_is_not_kept(tmp_path, monkeypatch):
    """A saved copy that loads back encoding the probe otherwise is dropped: the converted tokenizer is
    returned, and the next call converts again."""
    import transformers

    calls = []

    def convert():
        calls.append(1)
        return _tiny()

    real = transformers.AutoTokenizer.from_pretrained

    def other(path, *args, **kwargs):
        tok = real(path, *args, **kwargs)
        tok.add_tokens(["dog"])                                      # the copy no longer encodes "dog" as <unk>
        return tok

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", other)
    where = tmp_path / "t"
    tok = decoders.cached_tokenizer(convert, where, "the dog")
    assert calls == [1] and not where.exists() and list(tmp_path.iterdir()) == []
    assert tok("the dog", add_special_tokens=False)["input_ids"] == [3, 0]
    decoders.cached_tokenizer(convert, where, "the dog")
    assert calls == [1, 1]
