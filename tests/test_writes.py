"""Issue 14: what `migrate` does with a user's files: stdin always gives the whole text back,
links and owners survive, a file changed meanwhile or read-only is left alone, and one file that
cannot be read or written costs only that file."""
import os
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner

import ampfix.engine.run
from ampfix.cli import main

FIXABLE = "import torch\nx = torch.zeros(3).cuda()\n"
FIXED = 'import torch\nx = torch.zeros(3, device="cuda")\n'


def run(*args, input=None):
    return CliRunner().invoke(main, list(args), input=input)


def ampfix_stdin(data: bytes):
    return subprocess.run([sys.executable, "-m", "ampfix", "migrate", "-"], input=data, capture_output=True,
                          timeout=120)


@pytest.mark.parametrize("data", [b"x = 1\n", b"", b"# only a comment\r\n", b"import torch\nprint(torch.ones(1))\n",
                                  b"\xef\xbb\xbfimport os\n"])
def test_stdin_gives_the_text_back_when_nothing_applies(data):
    out = ampfix_stdin(data)
    assert out.stdout == data and out.returncode == 0, out.stderr


def test_stdin_syntax_error_exits_2_with_the_source_untouched():
    data = b"def f(:\n    return torch.zeros(3).cuda()\n"
    out = ampfix_stdin(data)
    assert out.returncode == 2 and out.stdout == data
    assert b"AMP000" in out.stderr


def test_stdin_fixes():
    out = ampfix_stdin(FIXABLE.encode())
    assert out.stdout.decode() == FIXED


def test_symlink_is_written_through_and_its_target_once(tmp_path):
    target = tmp_path / "real.py"
    target.write_text(FIXABLE)
    link = tmp_path / "link.py"
    link.symlink_to("real.py")
    out = run("migrate", "--write", str(link))
    assert link.is_symlink() and target.read_text() == FIXED, out.output
    target.write_text(FIXABLE)
    out = run("migrate", "--write", str(tmp_path))
    assert link.is_symlink() and target.read_text() == FIXED
    assert "Rewrote 1 file;" in out.output, out.output


def test_same_file_named_twice_counts_once(tmp_path, monkeypatch):
    f = tmp_path / "a.py"
    f.write_text(FIXABLE)
    monkeypatch.chdir(tmp_path)
    out = run("migrate", "--write", "a.py", str(f))
    assert "Rewrote 1 file;" in out.output and f.read_text() == FIXED


def test_hard_link_keeps_its_inode(tmp_path):
    f = tmp_path / "a.py"
    f.write_text(FIXABLE)
    other = tmp_path / "b.txt"
    os.link(f, other)
    ino = f.stat().st_ino
    run("migrate", "--write", str(f))
    assert f.stat().st_ino == ino and other.read_text() == FIXED


def test_owner_group_and_mode_are_kept(tmp_path):
    if os.getuid() != 0:
        pytest.skip("giving a file away needs root")
    f = tmp_path / "a.py"
    f.write_text(FIXABLE)
    os.chown(f, 65534, 65534)
    os.chmod(f, 0o640)
    run("migrate", "--write", str(f))
    st = f.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o640)
    assert f.read_text() == FIXED


def test_read_only_file_is_skipped_with_a_message(tmp_path):
    f = tmp_path / "a.py"
    f.write_text(FIXABLE)
    g = tmp_path / "b.py"
    g.write_text(FIXABLE)
    os.chmod(f, 0o444)
    out = run("migrate", "--write", str(tmp_path))
    assert f.read_text() == FIXABLE and "read-only" in out.output
    assert g.read_text() == FIXED
    assert out.exit_code == 2


def test_file_changed_meanwhile_is_not_overwritten(tmp_path, monkeypatch):
    f = tmp_path / "a.py"
    f.write_text(FIXABLE)
    g = tmp_path / "b.py"
    g.write_text(FIXABLE)
    real = ampfix.engine.run.check_paths

    def edited_meanwhile(*a, **k):
        results = real(*a, **k)
        f.write_text(FIXABLE + "y = 2\n")  # the user saves while ampfix runs
        return results

    monkeypatch.setattr(ampfix.engine.run, "check_paths", edited_meanwhile)
    out = run("migrate", "--write", str(tmp_path))
    assert f.read_text() == FIXABLE + "y = 2\n"
    assert "changed since ampfix read it" in out.output and g.read_text() == FIXED


def test_unreadable_entries_cost_only_themselves(tmp_path):
    good = tmp_path / "z_good.py"
    good.write_text(FIXABLE)
    (tmp_path / "loop_a.py").symlink_to("loop_b")
    (tmp_path / "loop_b").symlink_to("loop_a.py")
    os.mkfifo(tmp_path / "pipe.py")
    bad_name = os.path.join(os.fsencode(tmp_path), b"bad\xff.py")
    with open(bad_name, "wb") as fh:
        fh.write(FIXABLE.encode())
    out = subprocess.run([sys.executable, "-m", "ampfix", "migrate", "--write", str(tmp_path)], capture_output=True,
                         text=True, timeout=120)
    assert good.read_text() == FIXED, out.stderr
    assert "symlink loop" in out.stderr and "FIFO" in out.stderr and "not valid UTF-8" in out.stderr, out.stderr
    assert out.returncode == 2
    with open(bad_name, "rb") as fh:
        assert fh.read() == FIXABLE.encode()


def test_unreadable_folder_is_reported(tmp_path):
    if os.getuid() == 0:
        pytest.skip("root reads every folder")
    d = tmp_path / "locked"
    d.mkdir()
    (d / "a.py").write_text(FIXABLE)
    os.chmod(d, 0)
    try:
        out = run("check", str(tmp_path))
        assert "cannot read the folder" in out.output
    finally:
        os.chmod(d, 0o755)


# a migration planned across two modules: the library function takes the scaler, the script passes it
LIB = '''import torch
from apex import amp


def train_step(model, optimizer, x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
'''
SCRIPT = '''import torch
from apex import amp

from lib import train_step


def main(model, loader):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in loader:
        train_step(model, optimizer, x, y)
'''


def _two_module_plan(tmp_path):
    (tmp_path / "lib.py").write_text(LIB)
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "other.py").write_text(FIXABLE)  # a fix of its own, in no plan


def test_a_migration_across_modules_is_written_whole_or_not_at_all(tmp_path):
    _two_module_plan(tmp_path)
    os.chmod(tmp_path / "lib.py", 0o444)
    out = run("migrate", "--write", str(tmp_path))
    # lib.py cannot take the scaler parameter: train.py must not pass it (a TypeError), nor lose apex alone
    assert (tmp_path / "lib.py").read_text() == LIB and (tmp_path / "train.py").read_text() == SCRIPT, out.output
    assert "read-only" in out.output and "which could not be written" in out.output, out.output
    assert (tmp_path / "other.py").read_text() == FIXED  # what shares nothing with it is written
    assert out.exit_code == 2
    # writable again: both go in, together
    os.chmod(tmp_path / "lib.py", 0o644)
    out = run("migrate", "--write", str(tmp_path))
    lib, script = (tmp_path / "lib.py").read_text(), (tmp_path / "train.py").read_text()
    assert "apex" not in lib + script and "scaler" in lib and "scaler=scaler" in script, lib + script


def test_a_file_changed_meanwhile_keeps_back_its_migration_partner(tmp_path, monkeypatch):
    _two_module_plan(tmp_path)
    real = ampfix.engine.run.check_paths

    def edited_meanwhile(*a, **k):
        results = real(*a, **k)
        (tmp_path / "train.py").write_text(SCRIPT + "# saved meanwhile\n")
        return results

    monkeypatch.setattr(ampfix.engine.run, "check_paths", edited_meanwhile)
    out = run("migrate", "--write", str(tmp_path))
    assert (tmp_path / "lib.py").read_text() == LIB, out.output
    assert "changed since ampfix read it" in out.output and "which could not be written" in out.output


def test_writes_hold_ctrl_c_back_to_the_end(tmp_path, monkeypatch):
    """A Ctrl-C while the files are written lands after the last one: never half a migration."""
    import signal

    import ampfix.io.writer as writer

    _two_module_plan(tmp_path)
    real = writer.write_atomic
    calls = []

    def interrupted_write(path, *a, **k):
        calls.append(path)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C right after the first file
        return real(path, *a, **k)

    monkeypatch.setattr(writer, "write_atomic", interrupted_write)
    out = run("migrate", "--write", str(tmp_path))
    assert out.exit_code == 130, out.output
    assert len(calls) == 3  # every file was written before the interrupt was taken
    assert "apex" not in (tmp_path / "lib.py").read_text() + (tmp_path / "train.py").read_text()
