from paper_explorer.corpus import tokenize


def test_lowercases_and_splits_on_punctuation_and_underscores():
    assert tokenize("BERT-base vs. GPT_2!", stopwords=False) == ["bert", "base", "vs", "gpt", "2"]


def test_keeps_decimal_numbers_whole():
    assert tokenize("reaches 92.3 F1 on 1,000 sentences") == ["reaches", "92.3", "f1", "1,000", "sentences"]


def test_drops_stop_words_only_when_asked():
    assert tokenize("the model of the year") == ["model", "year"]
    assert tokenize("the model of the year", stopwords=False) == ["the", "model", "of", "the", "year"]


def test_unicode_letters_are_tokens():
    assert tokenize("Ünïcode Straße café") == ["ünïcode", "straße", "café"]


def test_empty_and_punctuation_only_text_has_no_tokens():
    assert tokenize("") == [] and tokenize(" --- !!! ") == []
