"""Issue 14: configuration never silently ignored, exit codes and signals, workers that die with
their parent, a worker crash that costs one file."""
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

import ampfix.engine.run
from ampfix.cli import main
from ampfix.model.diagnostic import FileResult
from ampfix.engine.run import check_paths
from ampfix.registry import all_rules
from ampfix.model.settings import Settings

FIXABLE = "import torch\nx = torch.zeros(3).cuda()\n"


@pytest.mark.parametrize("toml,expected", [
    ('[tool.ampfix\nselect = ["AMP1"]\n', "invalid TOML: Expected ']'"),
    ("[tool]\nampfix = 5\n", "[tool.ampfix] must be a table"),
    ("tool = 5\n", "'tool' is int 5, not a table"),
    ("[tool.ampfix]\ntorch-version = 2.10\n", "torch-version must be a string"),
])
def test_bad_configuration_is_an_error(tmp_path, toml, expected):
    (tmp_path / "pyproject.toml").write_text(toml)
    (tmp_path / "a.py").write_text("x = 1\n")
    out = CliRunner().invoke(main, ["check", str(tmp_path)])
    assert out.exit_code == 2 and expected in out.output and "pyproject.toml" in out.output, out.output
    assert "internal error" not in out.output


def test_empty_select_is_an_error(tmp_path):
    (tmp_path / "a.py").write_text(FIXABLE)
    out = CliRunner().invoke(main, ["check", "--select", "", str(tmp_path)])
    assert out.exit_code == 2 and "selects no rule" in out.output


def test_broken_pipe_is_quiet(tmp_path):
    for i in range(400):
        (tmp_path / f"f{i}.py").write_text(FIXABLE * 3)
    p = subprocess.run(f"{sys.executable} -m ampfix check -j 1 {tmp_path} | head -1", shell=True, capture_output=True,
                       text=True, timeout=300)
    assert p.stdout.count("\n") == 1
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr and "internal error" not in p.stderr, p.stderr


def _children(pid):
    out = subprocess.run(["ps", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[1:] if "ampfix" in line or "multiprocessing" in line]


def _slow_tree(tmp_path, n=400):
    big = "import torch\n" + "".join(f"x{i} = torch.zeros({i}).cuda()\nloss{i}.item()\n" for i in range(400))
    for i in range(n):
        (tmp_path / f"f{i}.py").write_text(big)


def _session(pid) -> list:
    return subprocess.run(["pgrep", "-s", str(pid)], capture_output=True, text=True).stdout.split()


def _start_with_workers(tmp_path, **kw):
    """`ampfix check` over a slow tree, once its worker processes are up (or it ended)."""
    _slow_tree(tmp_path)
    p = subprocess.Popen([sys.executable, "-m", "ampfix", "check", "--no-cache", "-j", "2", "--select", "ALL",
                          str(tmp_path)], stdout=subprocess.DEVNULL, start_new_session=True, **kw)
    deadline = time.time() + 30
    while time.time() < deadline and p.poll() is None and len(_session(p.pid)) < 3:
        time.sleep(0.1)
    time.sleep(0.5)
    return p


def _left_behind(pid) -> list:
    """The processes of the run's session still alive after 5 s."""
    deadline = time.time() + 5
    left = ["x"]
    while time.time() < deadline and left:
        left = _session(pid)
        time.sleep(0.2)
    return left


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signals_exit_code_and_no_orphan_workers(tmp_path, sig, code):
    if not hasattr(os, "getpgid"):
        pytest.skip("POSIX only")
    p = _start_with_workers(tmp_path, stderr=subprocess.PIPE, text=True)
    before = _session(p.pid)
    sent = time.monotonic()
    p.send_signal(sig)
    rc = p.wait(timeout=60)
    delay = time.monotonic() - sent
    err = p.stderr.read()
    if rc == 0 or rc == 1:
        pytest.skip(f"the run ended before the signal ({len(before)} processes)")
    assert rc == code, err
    assert delay < 2.0, f"the run took {delay:.1f} s to obey the signal"
    assert "Traceback" not in err
    assert not _left_behind(p.pid), "workers left behind"


def test_workers_die_with_a_killed_parent(tmp_path):
    p = _start_with_workers(tmp_path, stderr=subprocess.DEVNULL)
    if p.poll() is not None:
        pytest.skip("the run ended before the signal")
    p.kill()
    p.wait()
    assert not _left_behind(p.pid), "workers left behind"


def test_a_worker_crash_costs_only_its_file(tmp_path, monkeypatch):
    if sys.platform != "linux":
        pytest.skip("the workers fork here")
    paths = []
    for i in range(40):
        f = tmp_path / f"f{i:02}.py"
        f.write_text(FIXABLE)
        paths.append(str(f))
    real = ampfix.engine.run.check_source

    def crashing(data, path, *a, **k):
        if path.endswith("f07.py"):
            os.kill(os.getpid(), signal.SIGKILL)  # a crash, without a fault dump in the test output
        return real(data, path, *a, **k)

    monkeypatch.setattr(ampfix.engine.run, "check_source", crashing)
    codes = [r.code for r in all_rules() if r.default]
    results = check_paths([(p, codes) for p in paths], Settings(), workers=2)
    assert all(isinstance(r, FileResult) for r in results)
    crashed = [r for r in results if r.error]
    assert [r.path for r in crashed] == [paths[7]] and "crashed" in crashed[0].error
    assert all(any(d.code == "AMP302" for d in r.diagnostics) for r in results if not r.error)


def test_a_fix_that_breaks_the_syntax_is_left_out_not_a_crash():
    """Found on a public repository: a fix whose edits made `f(kw=1, x)`; tidying the imports
    parsed that text and raised, which crashed the worker and (with the old pool) hung the run."""
    import ast as _ast

    from ampfix.engine.check import check_source
    from ampfix.model.settings import Settings
    from ampfix.rule import Fix, ImportSpec, Rule

    class Breaks(Rule):
        code, name, summary, fix_kind, default, since, triggers = "AMP999", "breaks", "test", "safe", True, "1.0", ()

        def visit_Call(self, node: _ast.Call) -> None:
            if node.args:
                self.report(node, "breaks", Fix("break", [self.edits.insert_arg(node, "kw=1", first=True)],
                                                add_imports=[ImportSpec("torch")]))

    r = check_source(b"import os\nf(x)\n", "t.py", [Breaks], Settings(), fix="safe")
    assert r.fixed == "import os\nf(x)\n" and r.failed_fixes and "does not parse" in r.failed_fixes[0]
