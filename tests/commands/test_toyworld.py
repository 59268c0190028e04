"""`corag toyworld`: its flags write a world of the asked size."""

from __future__ import annotations

from corag.commands.toyworld import main


def test_main_writes_a_world(tmp_path, capsys):
    assert (
        main(["--out", str(tmp_path / "w"), "--seed", "2", "--num-entities", "60", "--train-per-hop", "5"])
        == 0
    )
    train = (tmp_path / "w" / "train.jsonl").read_text().splitlines()
    assert len(train) == 15
    assert str(tmp_path / "w") in capsys.readouterr().out
