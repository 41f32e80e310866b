"""The README's examples run as written, and its printed report is what the code prints."""

import pathlib
import re
import runpy

README = (pathlib.Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")


def _blocks(language):
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def _run(blocks, tmp_path):
    """Run README blocks as one script file (TVMScript reads its source from the file)."""
    script = tmp_path / "readme_example.py"
    script.write_text("\n".join(blocks), encoding="utf-8")
    return runpy.run_path(str(script))


def test_python_examples_run_in_order(tmp_path):
    blocks = _blocks("python")
    assert len(blocks) >= 2
    namespace = _run(blocks, tmp_path)
    assert namespace["reports"][-1].dtype == "float16"
    assert namespace["report"].find("lv3").rule == "fp32: excluded by name 'lv3'"
    assert namespace["report"].find("lv3").code == "excluded_by_name"  # as the README says
    assert '`report.find("lv3").code` is `"excluded_by_name"`' in README


def test_printed_report_matches_the_code(tmp_path):
    namespace = _run(_blocks("python")[:1], tmp_path)
    excerpt = README.split("For the model above:\n\n```\n", 1)[1].split("```", 1)[0]
    assert excerpt.strip() == str(namespace["reports"][-1]).strip()


def test_policy_json_example_matches_the_policy(tmp_path):
    import json

    namespace = _run(_blocks("python")[:2], tmp_path)
    assert json.loads(_blocks("json")[0]) == namespace["policy"].to_dict()


def test_quick_start_is_two_commands():
    quick = README.split("## Quick start", 1)[1].split("##", 1)[0]
    commands = [b.strip() for b in re.findall(r"```bash\n(.*?)```", quick, flags=re.S)]
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    assert commands[0].endswith("relay-amp sweep") and commands[1].endswith("pytest")


DOCS = pathlib.Path(__file__).parents[2] / "docs"


def test_the_readme_is_a_page_and_points_to_the_rest():
    assert len(README.splitlines()) <= 300
    for guide in ("docs/GUIDE.md", "docs/DESIGN.md"):
        assert f"]({guide})" in README


def test_no_harness_import_in_what_a_user_runs():
    """The README's code (Python and the GPU host's snippet) imports the package's public API,
    never the harness (relay_amp.eval) or the command's internals."""
    code = "\n".join(_blocks("python") + _blocks("py"))
    assert "relay_amp.eval" not in code and "relay_amp.cli" not in code
    assert "from relay_amp.cuda_loader import enable_cuda" in code


def test_docs_holds_prose_and_plots_its_data_in_results():
    """Measurements are read in docs/*.md; the raw rows they cite lie in docs/results/."""
    beside = [p.name for p in DOCS.iterdir() if p.suffix not in (".md", ".png")
              and p.name != "results"]
    assert beside == []
    assert len(list((DOCS / "results").glob("*.json*"))) >= 20


def test_every_relative_link_of_the_readme_and_docs_resolves():
    broken = []
    for path in [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                broken.append(f"{path.name}: {target}")
    assert broken == []
