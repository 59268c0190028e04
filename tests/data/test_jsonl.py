"""JSONL reading, atomic and crash-safe appending writes, and field validation."""

from __future__ import annotations

import pytest

from corag.data.jsonl import (
    JsonlAppender,
    UniqueIds,
    atomic_write,
    check_fields,
    check_str_list,
    iter_jsonl,
    read_jsonl,
    recover_jsonl,
    write_jsonl,
)
from corag.errors import InputError


def test_read_skips_blank_lines_and_numbers_real_lines(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": "a"}\n\n   \n{"id": "b"}\n', encoding="utf-8")
    assert list(iter_jsonl(path)) == [(1, {"id": "a"}), (4, {"id": "b"})]


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a"}\n\n{"id": "b",\n', encoding="utf-8")
    with pytest.raises(InputError) as err:
        read_jsonl(path)
    assert err.value.line == 3 and err.value.file == str(path)
    assert str(path) in str(err.value) and "line 3" in str(err.value)


def test_non_object_line_is_refused(tmp_path):
    path = tmp_path / "list.jsonl"
    path.write_text('{"id": "a"}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(InputError, match="expected a JSON object") as err:
        read_jsonl(path)
    assert err.value.line == 2


def test_write_then_read_round_trip_keeps_unicode(tmp_path):
    records = [{"id": "é", "text": "Pál Gábor\nline"}, {"id": "2", "n": [1, 2]}]
    assert write_jsonl(tmp_path / "out.jsonl", records) == 2
    assert read_jsonl(tmp_path / "out.jsonl") == records
    assert "Pál" in (tmp_path / "out.jsonl").read_text(encoding="utf-8")


def test_interrupted_atomic_write_leaves_no_partial_file(tmp_path):
    path = tmp_path / "out.jsonl"

    def records():
        yield {"id": "1"}
        raise KeyboardInterrupt  # the process is stopped in the middle of writing

    with pytest.raises(KeyboardInterrupt):
        write_jsonl(path, records())
    assert list(tmp_path.iterdir()) == []

    path.write_text('{"id": "old"}\n', encoding="utf-8")
    with pytest.raises(RuntimeError), atomic_write(path) as f:
        f.write('{"id": "new"}\n')
        raise RuntimeError("disk full")
    assert read_jsonl(path) == [{"id": "old"}]
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_appender_repairs_a_truncated_last_line_and_resumes(tmp_path):
    path = tmp_path / "chains.jsonl"
    with JsonlAppender(path, fsync=False) as out:
        assert out.existing == [] and out.dropped == 0
        for i in range(3):
            out.append({"id": str(i), "chain": ["x"] * i})
    full = path.read_bytes()
    path.write_bytes(full + b'{"id": "3", "cha')  # a crash cut the fourth record short

    records, dropped = recover_jsonl(path)
    assert [r["id"] for r in records] == ["0", "1", "2"] and dropped == 1
    assert path.read_bytes() == full  # the partial line is gone from the file too

    path.write_bytes(full + b'{"id": "3", "cha')
    with JsonlAppender(path, fsync=False) as out:
        assert [r["id"] for r in out.existing] == ["0", "1", "2"] and out.dropped == 1
        out.append({"id": "3"})
    assert [r["id"] for r in read_jsonl(path)] == ["0", "1", "2", "3"]


def test_recover_completes_a_whole_last_record_missing_its_newline(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"id": "0"}\n{"id": "1"}')
    records, dropped = recover_jsonl(path)
    assert [r["id"] for r in records] == ["0", "1"] and dropped == 0
    with JsonlAppender(path, fsync=False) as out:
        out.append({"id": "2"})
    assert [r["id"] for r in read_jsonl(path)] == ["0", "1", "2"]


def test_recover_still_refuses_damage_before_the_last_line(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"id": "0"}\n{"id": \n{"id": "2"}\n')
    with pytest.raises(InputError) as err:
        recover_jsonl(path)
    assert err.value.line == 2


def test_check_fields_names_missing_and_wrongly_typed_fields():
    spec = {"id": str, "answers": list}
    with pytest.raises(InputError, match="missing") as err:
        check_fields({"id": "q1"}, spec, file="f.jsonl", line=7, record_id="q1")
    assert (err.value.field, err.value.line, err.value.record) == ("answers", 7, "q1")
    with pytest.raises(InputError, match="expected a list, got str") as err:
        check_fields({"id": "q1", "answers": "Paris"}, spec, file="f.jsonl", line=7)
    assert err.value.field == "answers"
    with pytest.raises(InputError, match="expected an integer, got bool"):
        check_fields({"n": True}, {"n": int})
    check_fields({"id": "q", "answers": [], "meta": None}, spec, {"meta": dict})  # optional None is fine


def test_check_str_list_and_unique_ids():
    assert check_str_list(["a", "b"], "answers", non_empty=True) == ("a", "b")
    with pytest.raises(InputError, match="at least one"):
        check_str_list(["", "  "], "answers", non_empty=True, record_id="q")
    with pytest.raises(InputError, match="list of strings"):
        check_str_list(["a", 3], "answers")
    seen = UniqueIds("f.jsonl")
    seen.add("q1", 1)
    with pytest.raises(InputError, match="first on line 1") as err:
        seen.add("q1", 5)
    assert (err.value.record, err.value.line) == ("q1", 5)


def test_recovery_drops_a_last_line_cut_inside_a_character_and_reads_past_a_bom(tmp_path):
    path = tmp_path / "p.jsonl"
    whole = b'{"query_id": "a"}\n'
    path.write_bytes(b"\xef\xbb\xbf" + whole + '{"query_id": "é'.encode()[:-1])  # cut inside "é"
    records, dropped = recover_jsonl(path)
    assert records == [{"query_id": "a"}] and dropped == 1
    assert path.read_bytes() == b"\xef\xbb\xbf" + whole
