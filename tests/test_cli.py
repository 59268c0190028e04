"""The `corag` command: bad input is one line on stderr and exit status 2, a traceback only on request."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from corag.cli import COMMANDS, main
from corag.errors import InputError

REPO = Path(__file__).resolve().parents[1]


def test_bad_input_is_one_line_and_status_2(tmp_path, capsys):
    missing = tmp_path / "nowhere.jsonl"
    status = main(
        ["evaluate", "--data", str(missing), "--out-dir", str(tmp_path / "out"), "--predictions", "p"]
    )
    captured = capsys.readouterr()
    assert status == 2
    assert captured.err == f"corag evaluate: error: {missing}: no such file\n"
    assert "Traceback" not in captured.err and captured.out == ""


def test_debug_flag_and_environment_show_the_traceback(tmp_path, monkeypatch):
    args = ["evaluate", "--data", str(tmp_path / "x.jsonl"), "--out-dir", str(tmp_path), "--predictions", "p"]
    with pytest.raises(InputError, match="no such file"):
        main(["--debug", *args])
    monkeypatch.setenv("CORAG_DEBUG", "1")
    with pytest.raises(InputError, match="no such file"):
        main(args)


def test_a_message_with_newlines_still_prints_as_one_line(capsys):
    from corag.cli import run_command

    def bad(argv: list[str]) -> int:
        raise InputError("first\nsecond", file="f.jsonl", line=3, field="answers")

    assert run_command("demo", bad, []) == 2
    assert capsys.readouterr().err == "corag demo: error: f.jsonl, line 3, field 'answers': first second\n"


def test_stage_scripts_go_through_the_same_wrapper(tmp_path):
    """evaluation/evaluate.py is the same command: one line, status 2, no traceback."""
    proc = subprocess.run(
        [sys.executable, "evaluation/evaluate.py", "--data", str(tmp_path), "--out-dir", str(tmp_path / "o"),
         "--predictions", "p"],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"corag evaluate: error: {tmp_path}: is a folder, not a file"]


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in COMMANDS) and "--debug" in out
    assert main(["no-such-command"]) == 2


def test_the_commands_folder_holds_exactly_the_cli_commands():
    """corag/commands/ is the CLI's commands, one module each; what a job runs lives in corag/cluster/."""
    folder = Path(__file__).resolve().parents[1] / "corag" / "commands"
    modules = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    assert modules == {target.split(":")[0].rsplit(".", 1)[1] for target, _ in COMMANDS.values()}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_help_names_the_command(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([name, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: corag {name} ")


# Bad input through the commands: each kind is one line naming the file (line, id) and field -----------

KILT = "kilt/hotpotqa-dev-kilt.sample.jsonl"
HOTPOT = "hotpotqa/hotpot_dev_distractor_sample.json"
BAMBOOGLE = "bamboogle/bamboogle.csv"


def _lines(data: Path, name: str, n: int = 3) -> list[bytes]:
    return (data / name).read_bytes().splitlines(keepends=True)[:n]


def _kilt_copy(data: Path, tmp: Path, edit) -> Path:
    path = tmp / "nq-dev-kilt.jsonl"
    path.write_bytes(edit(b"".join(_lines(data, KILT))))
    return path


def _preds(tmp: Path, data: Path, rows: list[dict]) -> Path:
    ids = [json.loads(line)["id"] for line in _lines(data, KILT)]
    path = tmp / "p.jsonl"
    path.write_text("".join(json.dumps({"query_id": ids[i], **r}) + "\n" for i, r in rows), encoding="utf-8")
    return path


def _unanswer_later_lines(data: bytes) -> bytes:
    first, rest = data.split(b"\n", 1)
    return first + b"\n" + rest.replace(b'"answer": "', b'"x": "')


def _good_kilt(data: Path, tmp: Path) -> Path:
    return _kilt_copy(data, tmp, lambda b: b)


# (name, build(data, tmp) -> argv after `evaluate`, the one-line message's end, what it must name)
CASES = [
    ("non-UTF-8 line", lambda d, t: ["--data", _kilt_copy(d, t, lambda b: b.replace(b'"input": "', b'"input": "\xe9', 1))],
     "line 1: not UTF-8 text (byte 0xe9 at column", "nq-dev-kilt.jsonl"),
    ("non-UTF-8 one-line JSON", lambda d, t: ["--data", _write(t / "h.json", b'[{"_id": "a", "question": "\xff"}]')],
     "not UTF-8 text (byte 0xff at byte offset 27)", "h.json"),
    ("empty file", lambda d, t: ["--data", _write(t / "q.jsonl", b"")], "q.jsonl: empty file: no records", "q.jsonl"),
    ("folder", lambda d, t: ["--data", t], "is a folder, not a file", ""),
    ("no such file", lambda d, t: ["--data", t / "nope.jsonl"], "nope.jsonl: no such file", ""),
    ("truncated JSON lines", lambda d, t: ["--data", _write(t / "nq-dev-kilt.jsonl", b"".join(_lines(d, KILT))[:-400])],
     "the last line has no newline: the file looks cut short", "line 3"),
    ("truncated JSON array", lambda d, t: ["--data", _write(t / "h.json", (d / HOTPOT).read_bytes()[:5000])],
     "the array is never closed: the file looks cut short", "h.json: malformed JSON"),
    ("truncated CSV", lambda d, t: ["--data", _write(t / "b.csv", (d / BAMBOOGLE).read_bytes()[:200])],
     "columns where the first row has 7: the file looks cut short", "id 'bamboogle-2'"),
    ("unknown keys", lambda d, t: ["--data", _write(t / "q.jsonl", b'{"question_text": "x"}\n')],
     "no known format has the keys ['question_text'] of the first record", "q.jsonl"),
    ("no task", lambda d, t: ["--data", _write(t / "q.jsonl", b'{"query_id": "a", "query": "x", "answers": ["y"]}\n')],
     "cannot tell the task from the records or the file name; pass --task", "field 'task'"),
    ("unknown --task", lambda d, t: ["--data", _good_kilt(d, t), "--task", "chess"], "unknown task 'chess'", "field '--task'"),
    ("unknown task in a record", lambda d, t: ["--data", _write(t / "q.jsonl", b'{"id": "a", "query": "x", "answers": ["y"], "task": "quiz"}\n')],
     "unknown task 'quiz'", "line 1, id 'a'"),
    ("an answer missing from a gold file", lambda d, t: ["--data", _kilt_copy(d, t, _unanswer_later_lines)],
     "no non-empty answer, where the file's other records have one", "line 2"),
    ("alias file for other data", lambda d, t: ["--data", _good_kilt(d, t), "--aliases", _write(t / "a.json", b"{}")],
     "an alias file is for 2WikiMultihopQA questions, not 'kilt'", "nq-dev-kilt.jsonl"),
    ("a non-string prediction", lambda d, t: ["--data", _good_kilt(d, t), "--predictions", _preds(t, d, [(0, {"prediction": 7})])],
     "expected a string prediction", "field 'prediction'"),
    ("duplicate prediction", lambda d, t: ["--data", _good_kilt(d, t), "--predictions", _preds(t, d, [(0, {"prediction": "a"}), (0, {"prediction": "b"})])],
     "duplicate prediction", "line 2"),
    ("missing predictions refused", lambda d, t: ["--data", _good_kilt(d, t), "--require-all", "--predictions", _preds(t, d, [(0, {"prediction": "a"})])],
     "no prediction for 2 question(s)", "field 'query_id'"),
    ("a prediction file that is not there", lambda d, t: ["--data", _good_kilt(d, t), "--predictions", t / "gone.jsonl"],
     "gone.jsonl: no such file", ""),
    ("an empty prediction file", lambda d, t: ["--data", _good_kilt(d, t), "--predictions", _write(t / "p.jsonl", b"\n")],
     "no predictions in the file", "p.jsonl"),
    ("a page map that is not one", lambda d, t: ["--data", _good_kilt(d, t), "--page-ids", _write(t / "pages.json", b"[1, 2]")],
     "expected a JSON object of title -> page id, got list", "pages.json"),
    ("a step count that is not a number", lambda d, t: ["--data", _good_kilt(d, t), "--methods", "greedy:L=abc"],
     "L must be an integer, got 'abc' (in 'greedy:L=abc')", "field 'methods'"),
    ("no samples", lambda d, t: ["--data", _good_kilt(d, t), "--methods", "best_of_n:L=2:N=0"],
     "N must be 1 or more, got 0", "field 'methods'"),
    ("a setting the method lacks", lambda d, t: ["--data", _good_kilt(d, t), "--methods", "greedy:beam=2"],
     "greedy has no setting 'beam'", "field 'methods'"),
    ("a negative --limit", lambda d, t: ["--data", _good_kilt(d, t), "--limit", "-3"],
     "must be 1 or more, got -3", "field '--limit'"),
]  # fmt: skip


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(("name", "build", "message", "names"), CASES, ids=[c[0] for c in CASES])
def test_each_kind_of_bad_input_is_one_line(shared_data, tmp_path, capsys, name, build, message, names):
    argv = [str(a) for a in build(shared_data, tmp_path)]
    if "--predictions" not in argv:
        argv += [
            "--predictions",
            str(_write(tmp_path / "unused.jsonl", b'{"query_id": "x", "prediction": ""}\n')),
        ]
    status = main(["evaluate", *argv, "--out-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2, err
    assert err.startswith("corag evaluate: error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert message in err and names in err
    assert not (tmp_path / "out" / "metrics.json").exists()  # nothing written


def test_there_are_at_least_fifteen_kinds():
    assert len({c[0] for c in CASES}) >= 15


def test_an_output_that_is_an_input_is_refused_and_the_input_kept(shared_data, tmp_path, capsys):
    """Writing an output over an input would destroy it (predict truncated a 70 KB questions file to one
    prediction; from-contexts replaced its input with the corpus): refused in one line, every byte kept."""
    hotpot = tmp_path / "hotpot.json"
    hotpot.write_bytes((shared_data / HOTPOT).read_bytes())
    before = hotpot.read_bytes()
    runs = [
        ["predict", "--data", hotpot, "--out", hotpot, "--model", "m", "--corpus", "c", "--retriever", "r"],
        ["corpus", "from-contexts", hotpot, "--out", hotpot],
        ["corpus", "from-contexts", hotpot, "--out", tmp_path / "c.jsonl", "--questions", hotpot],
        [
            "corpus",
            "from-contexts",
            hotpot,
            "--out",
            tmp_path / "c.jsonl",
            "--questions",
            tmp_path / "c.jsonl",
        ],
        ["merge", "--questions", hotpot, "--out", hotpot, tmp_path / "chains-0.jsonl"],
    ]
    for argv in runs:
        assert main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "would destroy it; choose another path" in err, err
        assert hotpot.read_bytes() == before
    # default names keep the whole stem: two inputs never share one
    for name in ("musique_ans_v1.0_dev", "musique_ans_v1.0_train"):
        assert main(["corpus", "from-contexts", str(hotpot), "--out", str(tmp_path / f"{name}.jsonl")]) == 0
        assert (tmp_path / f"{name}.questions.jsonl").is_file()


# A misspelled flag or config key, in every command and recipe: one line naming the closest one ---------

# Commands whose first word is a subcommand, and the one their flags are tried on (a new command of this
# kind fails the test below until it is named here).
SUBCOMMAND = {"corpus": ["prepare"], "models": ["smollm2"], "train": ["sft"]}
# `corag plan`'s config is the stage's: its key is tried in a sampling config.
PLAN_CONFIG = REPO / "configs/sampling/toy.yaml"


def misspell(flag: str) -> str:
    """A flag or key with its first letter doubled: close to it, and no flag's prefix (argparse takes those)."""
    name = flag.removeprefix("--")
    return flag.removesuffix(name) + name[0] + name


def run(argv: list[str], capsys) -> tuple[int, str]:
    """Exit status and stderr of `corag ARGV` (recipes end in SystemExit, as the processes they are)."""
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = exit_.code
    return status, capsys.readouterr().err


def one_line(status: int, err: str, name: str, end: str) -> None:
    """`corag NAME [SUBCOMMAND]: error: ...END`, alone on stderr, and exit status 2."""
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"corag {name}") and ": error: " in err and err.endswith(f"{end}\n"), err


# corag submit passes sbatch's flags through to sbatch (which refuses a misspelled one); tests/commands/test_submit.py
@pytest.mark.parametrize("name", sorted(set(COMMANDS) - {"submit"}))
def test_a_misspelled_flag_or_key_is_one_line_naming_the_closest(name, tmp_path, capsys):
    command = [name, *SUBCOMMAND.get(name, [])]
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    helped = capsys.readouterr().out
    flags = [f for f in re.findall(r"(?<![\w-])--[a-z][a-z0-9_]*\b(?!-)", helped) if f != "--help"]
    flag = next((f for f in flags if f != "--config"), "--config")
    status, err = run([*command, misspell(flag)], capsys)
    one_line(status, err, name, f"unknown flag {misspell(flag)}; did you mean {flag}?")

    if name == "plan":
        key, base = "temperature", f"base: {PLAN_CONFIG}\n"
    else:
        positional = re.findall(r"positional arguments:\n\s+([A-Z_]+)", helped)
        key, base = flag[2:] if flag != "--config" else positional[0].lower(), ""
    config = tmp_path / "c.yaml"
    config.write_text(f"{base}{misspell(key)}: 1\n")
    status, err = run([*command, "--config", str(config)], capsys)
    one_line(status, err, name, f"{config}, field '{misspell(key)}': unknown config key; did you mean {key}?")


def load_script(path: Path):
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("script", ["recipes/sft.py", "recipes/grpo.py"])
def test_a_recipe_names_the_closest_flag_or_key_in_one_line(script, tmp_path, capsys):
    recipe = load_script(REPO / script)
    config = tmp_path / "c.yaml"
    config.write_text("learnig_rate: 0.1\n")
    for argv, end in [
        (["--learnig_rate", "0.1"], "unknown flag --learnig_rate; did you mean --learning_rate?"),
        (["--config", str(config)], f"{config}, field 'learnig_rate': unknown config key; did you mean learning_rate?"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            recipe.main([*argv, "--bf16", "false"])
        err = capsys.readouterr().err
        assert exit_.value.code == 2
        assert err.count("\n") == 1 and "Traceback" not in err and err.endswith(f": error: {end}\n"), err


def test_a_misspelled_command_or_subcommand_is_one_line(capsys):
    assert main(["smaple"]) == 2
    assert capsys.readouterr().err == "corag: error: unknown command 'smaple'; did you mean sample?\n"
    assert main(["corpus", "prepar"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("corag corpus: error: argument subcommand: invalid choice")
