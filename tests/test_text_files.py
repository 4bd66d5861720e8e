"""Files a user hands lvfl, read bounded (`lvfl.text_files`): one line for each refusal, never a traceback."""

from __future__ import annotations

import pytest


def test_side_knowledge_and_an_attacks_guesses_are_refused_in_one_line_not_a_traceback(tmp_path, monkeypatch) -> None:
    """Bytes that are not UTF-8, a field over the csv module's limit, a file over the size limit (before it is read),
    and a guess that is NaN (it was scored as a wrong guess)."""
    import json

    from lvfl import text_files
    from lvfl.attacks.side_knowledge import read_known_features, read_known_labels
    from lvfl.commands.attack_score import read_guesses

    known = tmp_path / "known.csv"
    known.write_bytes(b"id,label\n1,0\n\xff,1\n")
    with pytest.raises(ValueError, match=r"^side_knowledge='.*known.csv': not UTF-8 text \(byte 13: invalid start"):
        read_known_labels(known, 2)
    known.write_text("id,x0\n1," + "9" * 200_000 + "\n")
    with pytest.raises(ValueError, match=r"known.csv', line 2: field larger than field limit"):
        read_known_features(known)
    known.write_text("id,label\n1,0\n2,1\n")
    assert read_known_labels(known, 2) == {1: 0, 2: 1}
    guesses = tmp_path / "dli.csv"
    guesses.with_suffix(".json").write_text(json.dumps({"num_classes": 2, "metrics": ["auc"]}))
    guesses.write_text("epoch,step,id,s0,s1\n0,0,7,0.25,0.75\n0,0,8,nan,0.5\n")
    with pytest.raises(ValueError, match=r"dli.csv, line 3: a score is not finite \(NaN is no guess\)$"):
        read_guesses(guesses)
    guesses.write_text("epoch,step,id,s0,s1\n0,0,7,0.25,0.75\n")
    assert read_guesses(guesses)[1] == {0: [(0, [7], [[0.25, 0.75]])]}
    monkeypatch.setattr(text_files, "MAX_TEXT_BYTES", 8)
    with pytest.raises(ValueError, match=r"dli.csv: its description dli.json: \d+ bytes; at most 8 are read$"):
        read_guesses(guesses)
