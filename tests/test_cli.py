"""The command line, through click's runner (fast) and a real subprocess (as users run it)."""
import json
import os
import stat
import subprocess
import sys

from click.testing import CliRunner

from ampfix.version import __version__
from ampfix.cli import main

BAD = """
import torch
opt.zero_grad(set_to_none=False)
x = torch.zeros(3).cuda()
"""
GOOD = "import torch\nx = torch.zeros(3, device='cuda')\n"
FIXABLE = "import torch\nx = torch.zeros(3).cuda()\n"


def run(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False)


def test_check_reports_and_exit_codes(in_tmp, write):
    write("bad.py", BAD)
    write("good.py", GOOD)
    r = run("check", ".")
    assert r.exit_code == 1
    assert "bad.py:2:1: AMP301 [unsafe fix]" in r.output
    assert "bad.py:3:5: AMP302 [*]" in r.output
    assert ("Found 2 problems (1 fixable with 'ampfix migrate --write'; 1 more with "
            "'ampfix migrate --write --unsafe-fixes').") in r.output
    assert run("check", "good.py").exit_code == 0
    assert "All checks passed!" in run("check", "good.py").output
    assert run("check", "--exit-zero", "bad.py").exit_code == 0


def test_select_ignore_and_unknown_codes(in_tmp, write):
    write("bad.py", BAD)
    r = run("check", "--select", "AMP302", "bad.py")
    assert "AMP301" not in r.output and "AMP302" in r.output
    r = run("check", "--ignore", "AMP3", "bad.py")
    assert r.exit_code == 0
    r = CliRunner().invoke(main, ["check", "--select", "AMP999", "bad.py"])
    assert r.exit_code == 2 and "unknown rule selector 'AMP999'" in r.output


def test_json_output_schema(in_tmp, write):
    write("bad.py", BAD)
    r = run("check", "--output-format", "json", "bad.py")
    doc = json.loads(r.output)
    assert doc["schema"] == 1 and doc["ampfix_version"] == __version__
    assert doc["summary"] == {"problems": 2, "fixable": 1, "unsafe_fixable": 1}
    d = doc["diagnostics"][0]
    assert d["code"] == "AMP301" and d["path"] == "bad.py"
    assert d["location"] == {"line": 2, "column": 1}
    assert d["fix"]["applicability"] == "unsafe"  # None gradients change what the optimizer steps


def test_github_and_full_and_statistics(in_tmp, write):
    write("bad.py", BAD)
    r = run("check", "--output-format", "github", "bad.py")
    assert r.output.startswith("::error title=ampfix (AMP301),file=bad.py,line=2,col=1,")
    r = run("check", "--output-format", "full", "bad.py")
    assert "3 | x = torch.zeros(3).cuda()" in r.output and "^^^^" in r.output
    r = run("check", "--statistics", "bad.py")
    assert "1  AMP301      zero-grad-set-to-none" in r.output and "1  AMP302  [*] cpu-tensor-to-device" in r.output


def test_config_pyproject(in_tmp, write):
    write("pyproject.toml", '[tool.ampfix]\nignore = ["AMP301"]\nper-file-ignores = {"legacy/*" = ["AMP302"]}\n')
    write("bad.py", BAD)
    write("legacy/old.py", BAD)
    r = run("check", ".")
    assert "AMP301" not in r.output
    assert "bad.py:3:5: AMP302" in r.output and "old.py" not in r.output


def test_config_errors_name_the_key(in_tmp, write):
    write("pyproject.toml", '[tool.ampfix]\nselct = ["AMP301"]\n')
    write("bad.py", BAD)
    r = CliRunner().invoke(main, ["check", "."])
    assert r.exit_code == 2 and "unknown key(s) in [tool.ampfix]: selct" in r.output
    write("pyproject.toml", '[tool.ampfix]\nignore = ["AMP777"]\n')
    r = CliRunner().invoke(main, ["check", "."])
    assert r.exit_code == 2 and "AMP777" in r.output
    write("pyproject.toml", '[tool.ampfix]\ntarget = "torch.foo"\n')
    assert "target must be one of" in CliRunner().invoke(main, ["check", "."]).output


def test_torch_version_and_target_from_config(in_tmp, write):
    write("a.py", "opt.zero_grad()\nimport torch\nwith torch.cuda.amp.autocast():\n    pass\n")
    assert run("check", "a.py").exit_code == 1  # AMP202 only
    write("ampfix.toml", 'torch-version = "1.13"\ntarget = "torch.cuda.amp"\n')
    r = run("check", "a.py")
    assert "AMP301" in r.output and "AMP202" not in r.output


def test_noqa_and_skip_file(in_tmp, write):
    write("a.py", "import torch\nx = torch.zeros(3).cuda()  # noqa: AMP302\ny = torch.ones(2).cuda()  # noqa\n"
                  "z = torch.ones(2).cuda()  # noqa: AMP301\n")
    r = run("check", "a.py")
    assert r.output.count("AMP302") == 1 and "a.py:4:" in r.output
    write("b.py", "# ampfix: skip-file\nimport torch\nx = torch.zeros(3).cuda()\n")
    assert run("check", "b.py").exit_code == 0


def test_excludes_gitignore_and_explicit_files(in_tmp, write):
    write("src/a.py", BAD)
    write("build/gen.py", BAD)
    write(".venv/lib/x.py", BAD)
    write("src/ignored_dir/c.py", BAD)
    write("src/.gitignore", "ignored_dir/\n")
    (in_tmp / ".git").mkdir()
    r = run("check", ".")
    assert "src/a.py" in r.output
    assert "gen.py" not in r.output and ".venv" not in r.output and "c.py" not in r.output
    # named explicitly (as pre-commit does): checked even though excluded by default
    assert "gen.py" in run("check", "build/gen.py").output
    write("pyproject.toml", '[tool.ampfix]\nextend-exclude = ["src"]\n')
    assert run("check", ".").exit_code == 0
    assert run("check", "--no-respect-gitignore", "build/gen.py").exit_code == 1


def test_syntax_error_and_unreadable_file(in_tmp, write):
    write("bad.py", "import torch\ndef f(:\n    torch.zeros(1).cuda()\n")
    write("ok.py", BAD)
    r = run("check", ".")
    assert "bad.py:2:" in r.output and "AMP000" in r.output and "cannot parse" in r.output
    assert "ok.py:2:1: AMP301" in r.output  # the other files go on
    write("bin.py", b"\xff\xfe\x00torch\x00")
    r = run("check", "bin.py")
    assert "bin.py:1:1: AMP001" in r.output and "cannot decode" in r.output
    if os.geteuid() != 0:  # root reads anything
        p = write("locked.py", BAD)
        p.chmod(0)
        assert "cannot read" in run("check", "locked.py").output


def test_migrate_diff_write_idempotent_and_mode(in_tmp, write):
    p = write("bad.py", BAD)
    p.chmod(0o750)
    before = p.read_text()
    r = run("migrate", "bad.py")
    assert r.exit_code == 1
    assert "-x = torch.zeros(3).cuda()" in r.output and '+x = torch.zeros(3, device="cuda")' in r.output
    assert p.read_text() == before  # diff only
    r = run("migrate", "--write", "--unsafe-fixes", "bad.py")
    assert r.exit_code == 0
    assert p.read_text() == 'import torch\nopt.zero_grad()\nx = torch.zeros(3, device="cuda")\n'
    assert stat.S_IMODE(p.stat().st_mode) == 0o750
    assert not [f for f in os.listdir(in_tmp) if f.startswith(".ampfix-")]
    again = run("migrate", "--write", "--unsafe-fixes", "bad.py")
    assert again.exit_code == 0 and p.read_text() == 'import torch\nopt.zero_grad()\nx = torch.zeros(3, device="cuda")\n'
    assert run("migrate", "bad.py").output.count("+++") == 0


def test_migrate_unsafe_fixes_and_report(in_tmp, write):
    p = write("r.py", "import torch\nx = torch.randn(3).cuda()\n")
    r = run("migrate", "--write", "r.py")
    assert r.exit_code == 1 and "needs --unsafe-fixes" in r.output
    assert "randn(3).cuda()" in p.read_text()
    r = run("migrate", "--write", "--unsafe-fixes", "r.py")
    assert r.exit_code == 0 and p.read_text() == 'import torch\nx = torch.randn(3, device="cuda")\n'


def test_stdin(in_tmp):
    r = run("check", "--stdin-filename", "x.py", "-", input=BAD.lstrip())
    assert "x.py:2:1: AMP301" in r.output
    r = CliRunner().invoke(main, ["migrate", "--unsafe-fixes", "-"], input=BAD.lstrip())
    assert r.stdout == 'import torch\nopt.zero_grad()\nx = torch.zeros(3, device="cuda")\n'


def test_parallel_output_is_deterministic(in_tmp, write):
    for i in range(40):
        write(f"pkg/m{i:02d}.py", BAD)
    one = run("check", "-j", "1", "pkg").output
    many = run("check", "-j", "2", "pkg").output
    assert one == many and one.count("AMP301") == 40


def test_rules_and_explain():
    r = run("rules")
    assert "AMP301  zero-grad-set-to-none" in r.output
    data = json.loads(run("rules", "--output-format", "json").output)
    assert {"code", "name", "fix", "default", "summary"} <= set(data[0])
    r = run("explain", "amp301")
    assert "## Why is this bad?" in r.output and "Advice holds from torch" in r.output
    assert CliRunner().invoke(main, ["explain", "AMP999"]).exit_code == 2


def test_missing_path_is_a_usage_error(in_tmp):
    r = CliRunner().invoke(main, ["check", "nope/"])
    assert r.exit_code == 2 and "nope/: no such file or folder" in r.output


def test_console_script_subprocess(tmp_path):
    f = tmp_path / "t.py"
    f.write_text(BAD.lstrip())
    out = subprocess.run([sys.executable, "-m", "ampfix", "--version"], capture_output=True, text=True)
    assert out.stdout.strip() == f"ampfix, version {__version__}"
    out = subprocess.run(["ampfix", "check", str(f)], capture_output=True, text=True)
    assert out.returncode == 1 and "AMP301" in out.stdout
    out = subprocess.run(["ampfix", "check", "--select", "NOPE", str(f)], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr


def test_unsafe_fixes_from_config(in_tmp, write):
    write("pyproject.toml", "[tool.ampfix]\nunsafe-fixes = true\n")
    p = write("r.py", "import torch\nx = torch.randn(3).cuda()\n")
    assert run("migrate", "--write", "r.py").exit_code == 0
    assert p.read_text() == 'import torch\nx = torch.randn(3, device="cuda")\n'


def test_verify_without_torch_is_a_one_line_error(monkeypatch, tmp_path):
    """Documented: exit 2 with a message, not a traceback from the child process."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    script = tmp_path / "t.py"
    script.write_text("print('hi')\n")
    r = CliRunner().invoke(main, ["verify", "--device", "cpu", str(script)])
    assert r.exit_code == 2 and "needs torch" in r.output and "Traceback" not in r.output


def test_migrate_dry_run_names_lines_of_the_file_as_it_is(tmp_path):
    """The rewrite drops two import lines and adds one: what is left for a person is reported
    where `check` reports it (the file is not changed by a dry run); after --write, in the new text."""
    f = tmp_path / "train.py"
    f.write_text("import torch\nimport apex\nfrom apex import amp\n\n"
                 "model = torch.nn.Linear(4, 4).cuda()\n"
                 "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                 "model, optimizer = amp.initialize(model, optimizer, opt_level='O1')\n"
                 "for step in range(10):\n"
                 "    x = torch.randn(8, 4, device='cuda')\n"
                 "    loss = model(x).sum()\n"
                 "    optimizer.zero_grad()\n"
                 "    with amp.scale_loss(loss, optimizer) as scaled:\n"
                 "        scaled.backward()\n"
                 "    optimizer.step()\n"
                 "    print(loss.item())\n")
    checked = CliRunner().invoke(main, ["check", "--no-cache", str(f)]).output
    at = next(line.split(": AMP303")[0] for line in checked.splitlines() if "AMP303" in line)
    assert at.endswith(":15:11")
    dry = CliRunner().invoke(main, ["migrate", str(f)])
    assert f"left for a person: {at}: AMP303" in dry.stderr
    wrote = CliRunner().invoke(main, ["migrate", "--write", str(f)])
    line = next(n for n, text in enumerate(f.read_text().splitlines(), 1) if "loss.item()" in text)
    assert f"left for a person: {f}:{line}:11: AMP303" in wrote.stderr


def test_a_folder_without_python_files_says_so(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing to check\n")
    r = CliRunner().invoke(main, ["check", str(tmp_path)])
    assert r.exit_code == 0 and "no Python files found under" in r.stderr


NOQA_CASES = (
    "import torch\n"
    "x = torch.zeros(3).cuda()\n"
    "y = torch.ones(3).cuda()  # noqa: AMP999\n"
    "z = torch.zeros(2).cuda()  # a note\n"
    "s = (torch.zeros(4).cuda(), '''a\n"
    "b''')\n"
)


def test_add_noqa_then_check_passes(tmp_path):
    f = tmp_path / "a.py"
    f.write_text(NOQA_CASES)
    r = CliRunner().invoke(main, ["check", "--add-noqa", str(f)])
    assert r.exit_code == 0, r.output
    text = f.read_text()
    assert "x = torch.zeros(3).cuda()  # noqa: AMP302\n" in text
    assert "y = torch.ones(3).cuda()  # noqa: AMP302, AMP999\n" in text  # merged into the one there
    assert "z = torch.zeros(2).cuda()  # a note  # noqa: AMP302\n" in text
    # the line's end is inside a string: not touched, and said
    assert "s = (torch.zeros(4).cuda(), '''a\nb''')\n" in text and ":5: no noqa added" in r.stderr
    after = CliRunner().invoke(main, ["check", "--no-cache", str(f)])
    assert [line.split(":")[1] for line in after.output.splitlines() if "AMP302" in line] == ["5"]
    # a second run adds nothing
    again = CliRunner().invoke(main, ["check", "--add-noqa", str(f)])
    assert f.read_text() == text and "Added 0 noqa" in again.stderr


def test_check_fix_and_diff_are_migrate(tmp_path):
    f = tmp_path / "a.py"
    f.write_text(FIXABLE)
    diff = CliRunner().invoke(main, ["check", "--diff", str(f)])
    assert diff.exit_code == 1 and "+x = torch.zeros(3, device=" in diff.stdout and f.read_text() == FIXABLE
    shown = CliRunner().invoke(main, ["check", "--show-fixes", "--no-cache", str(f)])
    assert "Fixes available" in shown.output and "AMP302 [safe]" in shown.output
    fixed = CliRunner().invoke(main, ["check", "--fix", str(f)])
    assert fixed.exit_code == 0 and "device=" in f.read_text()
    assert CliRunner().invoke(main, ["check", "--fix", "--diff", str(f)]).exit_code == 2


def test_gitignore_follows_git_wildmatch_and_info_exclude(in_tmp, write):
    """Patterns git reads as git does (pathspec): `**`, character classes, a negation inside a
    folder's pattern, an escaped '#'; and the repository's .git/info/exclude."""
    (in_tmp / ".git" / "info").mkdir(parents=True)
    write(".git/info/exclude", "scratch/\n")
    write(".gitignore", "**/gen/**\nexp[0-9]*.py\n\\#tmp.py\nlogs/*\n!logs/keep.py\n")
    for f in ("a/gen/b/x.py", "exp1_run.py", "#tmp.py", "logs/old.py", "scratch/try.py",
              "logs/keep.py", "expX.py", "src/generator.py"):
        write(f, BAD)
    out = run("check", ".").output
    checked = {line.split(":")[0] for line in out.splitlines() if "AMP30" in line}
    assert checked == {"logs/keep.py", "expX.py", "src/generator.py"}, out
