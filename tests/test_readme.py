"""The README's and docs/cluster.md's commands: every `corag` command they show exists and every flag it
passes is one the command takes (read from the command's own --help); every relative link of the README
and docs/ leads to a file and heading that exist; the README reads in ten minutes."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from corag.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
CLUSTER = REPO / "docs" / "cluster.md"
# The pages whose ```bash blocks users copy: the README and the cluster path it links to.
PAGES = (README, CLUSTER)


def bash_blocks(path: Path) -> str:
    """The text of a page's ```bash blocks, continuation lines joined."""
    blocks = re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.DOTALL)
    return "\n".join(blocks).replace("\\\n", " ")


def corag_commands(path: Path) -> list[list[str]]:
    """Each `corag ...` command line of a page's bash blocks (without the leading `corag`)."""
    commands = []
    for line in bash_blocks(path).splitlines():
        words = shlex.split(line, comments=True)
        while words and "=" in words[0]:  # VAR=value prefixes
            words = words[1:]
        if words[:1] == ["corag"]:
            commands.append(words[1:])
    return commands


def readme_commands() -> list[list[str]]:
    """Each `corag ...` command line of the README's bash blocks, continuation lines joined."""
    return corag_commands(README)


def page_commands() -> list[tuple[str, list[str]]]:
    return [(path.name, words) for path in PAGES for words in corag_commands(path)]


def test_the_readme_and_the_cluster_page_show_commands() -> None:
    assert len(corag_commands(README)) >= 10
    assert len(corag_commands(CLUSTER)) >= 15


@pytest.mark.parametrize(
    ("page", "words"), page_commands(), ids=[f"{p}: {' '.join(w[:3])}" for p, w in page_commands()]
)
def test_every_readme_command_and_flag_exists(page: str, words: list[str], capsys) -> None:
    name = words[0]
    assert name in COMMANDS, f"{page}: corag {name}"
    args = words[1:]
    if name in ("corpus", "models", "train"):  # subcommands: their own help
        args, help_args = args[1:], [name, args[0], "--help"]
    else:
        help_args = [name, "--help"]
    with pytest.raises(SystemExit):
        main(help_args)
    helped = capsys.readouterr().out
    flags = [a.split("=")[0] for a in args if a.startswith("--")]
    missing = [f for f in flags if not re.search(rf"{re.escape(f)}\b", helped)]
    assert not missing, f"{page}: corag {' '.join(words)}: {missing} not in its --help"


def sbatch_commands(text: str) -> list[tuple[str, set[str]]]:
    """Each `sbatch` command line in `text` (continuation lines joined) that submits a script (not a
    `--wrap` command, such as the iterate driver's own job): its script and its flags."""
    commands = []
    for line in text.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["sbatch"] and not any(w.startswith("--wrap") for w in words):
            script = next(w for w in words if w.endswith(".sh"))
            commands.append((script, {w.split("=")[0] for w in words if w.startswith("--")}))
    return commands


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_simulated_cluster_run_submits_what_the_pages_show(page: Path) -> None:
    """tests/slurm/run.sh (CI) submits every sbatch command of the page's bash blocks: the same script
    with at least the same flags (it adds the resources of its fake nodes)."""
    shown = sbatch_commands(bash_blocks(page))
    run = sbatch_commands((REPO / "tests" / "slurm" / "run.sh").read_text())
    assert {script for script, _ in shown} == {
        "sampling/slurm_array.sh", "recipes/slurm_train.sh", "evaluation/slurm_eval.sh", "sampling/slurm_smoke.sh",
        "sampling/slurm_encode.sh",
    }  # fmt: skip
    for script, flags in shown:
        assert any(s == script and flags <= f for s, f in run), (page.name, script, flags)


def test_the_readme_reads_in_ten_minutes() -> None:
    """At most 250 lines: the cluster path in full and the measurements live in docs/."""
    assert len(README.read_text().splitlines()) <= 250


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)  # a `# comment` is no heading
    return {anchor(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}


def links() -> list[tuple[Path, str]]:
    """Every relative link (`[text](target)`) of the README and the pages in docs/."""
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    found = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if not re.match(r"[a-z]+:", target):
                found.append((page, target))
    return found


def test_the_readme_links_to_the_moved_pages() -> None:
    targets = {t.split("#")[0] for page, t in links() if page == README}
    assert {"docs/cluster.md", "docs/benchmarks.md", "docs/architecture.md", "docs/toy-study.md"} <= targets


@pytest.mark.parametrize(("page", "target"), links(), ids=lambda x: x.name if isinstance(x, Path) else x)
def test_every_relative_link_leads_to_a_file_and_heading(page: Path, target: str) -> None:
    file, _, fragment = target.partition("#")
    path = (page.parent / file).resolve() if file else page
    assert path.exists(), f"{page.name}: {target}"
    if fragment and path.suffix == ".md":
        assert fragment in anchors(path), f"{page.name}: {target}"
