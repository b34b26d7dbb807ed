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


def test_large_catalog_uses_anchor_scan_with_same_result():
    catalog = [f"passage number {i:03d} says something long enough to anchor." for i in range(200)]
    prompt = "Context:\n" + catalog[150] + "\n\n" + catalog[7] + "\nQ?"
    m = find_chunks(prompt, catalog + ["short"])
    assert [x.text for x in m] == [catalog[150], catalog[7]]


def test_no_candidates_means_one_text_piece():
    assert find_chunks("anything", []) == []
    assert split_prompt("anything", []) == [("anything", False)]
