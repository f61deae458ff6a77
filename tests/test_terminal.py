"""The terminal: colour on a TTY only (NO_COLOR / FORCE_COLOR decide first), progress on stderr
only when it is a TTY, a closed pipe is a quiet end."""
import os
import pty
import subprocess
import sys

BAD = "import torch\nx = torch.zeros(3).cuda()\n"


def run_on_pty(args, env_extra=None, stdout_tty=True, stderr_tty=False, cwd=None):
    master, slave = pty.openpty()
    env = {**os.environ, **(env_extra or {})}
    env.pop("NO_COLOR", None) if "NO_COLOR" not in (env_extra or {}) else None
    env.pop("FORCE_COLOR", None) if "FORCE_COLOR" not in (env_extra or {}) else None
    p = subprocess.Popen([sys.executable, "-m", "ampfix", *args], env=env, cwd=cwd,
                         stdout=slave if stdout_tty else subprocess.PIPE,
                         stderr=slave if stderr_tty else subprocess.PIPE)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    out, err = p.communicate()
    os.close(master)
    return b"".join(chunks).decode(), (out or b"").decode(), (err or b"").decode()


def test_colour_on_a_terminal_not_in_a_pipe(tmp_path):
    f = tmp_path / "t.py"
    f.write_text(BAD)
    tty, _, _ = run_on_pty(["check", "--no-cache", str(f)])
    assert "\x1b[31m" in tty and "AMP302" in tty
    _, piped, _ = run_on_pty(["check", "--no-cache", str(f)], stdout_tty=False)
    assert "AMP302" in piped and "\x1b[" not in piped
    tty, _, _ = run_on_pty(["check", "--no-cache", str(f)], {"NO_COLOR": "1"})
    assert "AMP302" in tty and "\x1b[" not in tty
    _, piped, _ = run_on_pty(["check", "--no-cache", str(f)], {"FORCE_COLOR": "1"}, stdout_tty=False)
    assert "\x1b[31m" in piped


def test_progress_only_when_stderr_is_a_terminal(tmp_path):
    for i in range(40):
        (tmp_path / f"f{i}.py").write_text(BAD + "".join(f"y{k} = {k}\n" for k in range(3000)))
    tty, _, _ = run_on_pty(["check", "--no-cache", "-j", "1", str(tmp_path)], stdout_tty=False, stderr_tty=True)
    assert "/40 files" in tty
    _, _, err = run_on_pty(["check", "--no-cache", "-j", "1", str(tmp_path)], stdout_tty=False)
    assert "files" not in err


def test_a_closed_pipe_is_a_quiet_end(tmp_path):
    for i in range(30):
        (tmp_path / f"f{i}.py").write_text(BAD * 50)
    p = subprocess.run(f"{sys.executable} -m ampfix check --no-cache {tmp_path} | head -1", shell=True,
                       capture_output=True, text=True)
    assert p.stdout.count("\n") == 1 and "Error" not in p.stderr and "error" not in p.stderr
