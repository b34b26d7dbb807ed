"""Finding cached chunks' exact text in a prompt."""

from ragpic.core.segments import find_chunks, split_prompt


def test_finds_repeated_reordered_and_overlapping_chunks():
    a, b = "alpha beta gamma", "gamma delta"
    prompt = f"ctx:\n{b}\n\n{a}\n\n{a} end"
    m = find_chunks(prompt, [a, b])
    assert [x.text for x in m] == [b, a, a]
    pieces = split_prompt(prompt, m)
    assert "".join(p for p, _ in pieces) == prompt
    assert [c for _, c in pieces] == [False, True, False, True, False, True, False]


def test_overlap_prefers_earlier_then_longer():
    prompt = "xx alpha beta gamma delta"
    m = find_chunks(prompt, ["alpha beta", "alpha beta gamma", "beta gamma delta"])
    assert [x.text for x in m] == ["alpha beta gamma"]


class _NoFind(str):
    """A prompt whose ``find`` fails: the per-candidate ``str.find`` search must not run."""

    def find(self, *args):
        raise AssertionError("a large catalog went through the per-candidate str.find search")


def test_large_catalog_uses_anchor_scan_with_same_result():
    catalog = [f"passage number {i:03d} says something long enough to anchor." for i in range(200)]
    longer = catalog[150] + " And it goes on."  # shares its first characters (its anchor) with catalog[150]
    prompt = "Context:\n" + longer + "\n\n" + catalog[7] + "\n" + catalog[7] + "\neat a sandwich in dolores park\nQ?"
    # several candidates per anchor, short candidates of two lengths, a chunk twice, one absent
    m = find_chunks(_NoFind(prompt), catalog + [longer, "sandwich", "dolores park", "short"])
    assert [x.text for x in m] == [longer, catalog[7], catalog[7], "sandwich", "dolores park"]
    assert all(prompt[x.start:x.end] == x.text for x in m)


def test_no_candidates_means_one_text_piece():
    assert find_chunks("anything", []) == []
    assert split_prompt("anything", []) == [("anything", False)]


def test_a_document_cut_inside_words_matches_where_its_pieces_meet():
    doc = "The keeper wrote 1234 hours in his logbook, and the international supply boat came in March."
    cuts = [0, 19, 42, 57, 69, len(doc)]  # inside "1234", before ", and", inside "international", "supply"
    pieces = [doc[a:b] for a, b in zip(cuts, cuts[1:])]
    prompt = "Read this:\n" + doc + "\nQ?"
    assert [m.text for m in find_chunks(prompt, pieces)] == pieces
    assert split_prompt(prompt, find_chunks(prompt, pieces))[1:-1] == [(p, True) for p in pieces]
    # a piece alone matches only on word boundaries: its neighbour holds the rest of the word
    assert find_chunks(prompt, pieces[:1]) == []
    # without the middle piece, the pieces after it start and end inside words nothing else fills
    assert [m.text for m in find_chunks(prompt, pieces[:2] + pieces[3:])] == pieces[:2]
    # a piece whose neighbour loses an overlap loses the rest of its word with it
    longer = doc[42:66]  # starts where piece 2 does and is longer, so it wins; piece 3 overlaps it
    assert [m.text for m in find_chunks(prompt, [*pieces, longer])] == [*pieces[:2], longer]
