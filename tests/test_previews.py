from envs.previews import PreviewConfig, best_window, make_preview, query_terms
from envs.tokens import TokenCounter

LONG = (
    "Alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
    "upsilon phi chi psi omega. " * 3
    + "The Spree river flows through Berlin, and the Spree joins the Havel near Spandau. "
    + "Filler words continue here for a while so that the passage is long enough to need a window. " * 3
)


def test_query_terms_drop_stopwords():
    assert query_terms("Which river flows through the city of Berlin?") == {"river", "flows", "city", "berlin"}


def test_window_finds_the_query_region_and_respects_width():
    window = best_window(LONG, query_terms("Spree river Berlin"), 240)
    assert "Spree" in window and "Berlin" in window
    assert len(window) <= 240
    assert not window.startswith("Alpha")


def test_window_without_matches_is_the_opening():
    assert best_window(LONG, query_terms("zebra"), 50).startswith("Alpha beta")


def test_short_text_is_kept_whole():
    assert best_window("Short text.", query_terms("text"), 240) == "Short text."


def test_preview_title_cut_and_token_cap():
    title = "T" * 100
    preview = make_preview(title, LONG, "Spree Berlin", PreviewConfig(), TokenCounter())
    assert preview.startswith("T" * 80 + ": ")
    assert "T" * 81 not in preview
    assert len(preview.split()) <= 61  # 60 tokens + the "..." marker
    capped = make_preview("Title", LONG, "Spree", PreviewConfig(max_tokens=5), TokenCounter())
    assert capped.endswith(" ...") and len(capped.split()) == 6


class CharTokenizer:
    """A tokenizer stand-in: one token per character."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_preview_marks_left_out_text():
    text = "Opening words here. The Spree flows through Berlin. Closing words follow after it."
    preview = make_preview("T", text, "Spree Berlin", PreviewConfig(window_chars=35), TokenCounter())
    assert preview == "T: ... The Spree flows through Berlin ..."
    whole = make_preview("T", "Short text.", "text", PreviewConfig(), TokenCounter())
    assert whole == "T: Short text."


def test_preview_cap_uses_policy_tokenizer():
    preview = make_preview("Title", LONG, "Spree", PreviewConfig(max_tokens=20), TokenCounter(CharTokenizer()))
    assert preview == "Title: " + preview[7:20] + " ..."
