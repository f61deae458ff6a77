"""The ``ampfix`` command line."""
from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Optional

import click

from ampfix.version import __version__
from ampfix.io.config import Config, ConfigError, apply_overrides, load_config
from ampfix.output.report import FORMATS

from ampfix.exits import EXIT_ERROR, EXIT_OK, EXIT_PROBLEMS


def _common(f):
    options = [
        click.argument("paths", nargs=-1, type=click.Path()),
        click.option("--config", "config_path", type=click.Path(dir_okay=False),
                     help="Use this pyproject.toml or ampfix.toml instead of searching for one."),
        click.option("--select", help="Comma-separated rule codes or prefixes to enable (replaces the default set)."),
        click.option("--extend-select", help="Rule codes or prefixes to enable on top of the selection."),
        click.option("--ignore", help="Comma-separated rule codes or prefixes to disable."),
        click.option("--target", help="Native spelling to write: torch.amp or torch.cuda.amp (default: what the "
                                       "project's torch has: torch.amp from 2.3)."),
        click.option("--torch-version", help="The torch release the code runs on, e.g. 1.13 or 2.4 (default: the "
                                              "project's pin in requirements/pyproject/setup, else 2.4)."),
        click.option("--dtype", type=click.Choice(["float16", "bfloat16"]), default=None,
                     help="The half precision migrations write: float16 (autocast + GradScaler, the default) or "
                          "bfloat16 (autocast alone: no loss scaling; Ampere GPUs and newer)."),
        click.option("--extend-exclude", multiple=True, help="More glob patterns to exclude."),
        click.option("--no-respect-gitignore", is_flag=True, help="Check files that .gitignore excludes."),
        click.option("--stdin-filename", help="The name to report for code read from '-'."),
        click.option("--jobs", "-j", type=int, default=None, help="Worker processes (default: all cores)."),
        click.option("--exit-zero", is_flag=True, help="Exit 0 even when problems are found."),
        click.option("--verbose", "-v", is_flag=True, help="Show tracebacks of internal errors."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def _config(kw) -> Config:
    paths = kw["paths"] or (".",)
    start = Path(paths[0]) if paths[0] != "-" else Path.cwd()
    cfg = load_config(Path(kw["config_path"]) if kw["config_path"] else None,
                      start if start.exists() else Path.cwd())
    return _with_flags(cfg, kw, start if start.exists() else Path.cwd())


def _with_flags(cfg: Config, kw, start: Path) -> Config:
    """The command line's flags over a loaded configuration (they win over every file)."""
    return apply_overrides(cfg, start, select=kw["select"], extend_select=kw["extend_select"], ignore=kw["ignore"],
                           target=kw["target"], torch_version=kw["torch_version"], dtype=kw.get("dtype"),
                           extend_exclude=kw["extend_exclude"], respect_gitignore=not kw["no_respect_gitignore"])


def _codes_by_nearest_config(cfg: Config, kw, files, selected):
    """(file, its rule codes): each file obeys the configuration nearest to it (``sub/pyproject.toml``
    for the files under ``sub/``, as in ruff), with the command line's flags on top.  A run has
    one torch version and spelling: a nearer file that sets others is named, not ignored silently."""
    if kw.get("config_path"):  # --config: one configuration for every file
        return [(f, cfg.codes_for(f, selected)) for f in files]
    from ampfix.io.config import find_config

    found: dict = {}
    out = []
    for f in files:
        d = f.parent
        if d not in found:
            near = find_config(d)
            if near is None or cfg.source is None or near.resolve() == Path(cfg.source).resolve():
                found[d] = (cfg, selected)
            else:
                sub = _with_flags(load_config(near), kw, d)
                found[d] = (sub, sub.selected_codes())
                if sub.settings.torch_version != cfg.settings.torch_version or sub.settings.target != cfg.settings.target:
                    click.echo(f"ampfix: warning: {near} sets torch {'.'.join(map(str, sub.settings.torch_version))} / "
                               f"{sub.settings.target}, but one run uses one ({'.'.join(map(str, cfg.settings.torch_version))}"
                               f" / {cfg.settings.target}, from {cfg.source}); its rule selection applies to its files "
                               f"here: run ampfix in {near.parent} for its own torch version", err=True)
        c, sel = found[d]
        out.append((f, c.codes_for(f, sel)))
    return out


def run_paths(kw, fix: Optional[str]):
    """Check (and maybe fix) everything named; returns (config, results)."""
    from ampfix.engine.check import check_source
    from ampfix.engine.run import check_paths
    from ampfix.io.files import discover
    from ampfix.registry import rules_by_code

    cfg = _config(kw)
    if fix == "config":  # --unsafe-fixes not given: the configuration decides
        fix = "unsafe" if cfg.unsafe_fixes else "safe"
    selected = cfg.selected_codes()
    paths = list(kw["paths"]) or ["."]
    if "-" in paths:
        if len(paths) > 1:
            raise ConfigError("'-' (standard input) cannot be combined with other paths")
        name = kw["stdin_filename"] or "-"
        codes = cfg.codes_for(Path(name), selected)
        data = sys.stdin.buffer.read()
        result = check_source(data, name, [rules_by_code()[c] for c in codes], cfg.settings, fix)
        result.input = data  # stdin can be read once: the text to give back when nothing changes
        return cfg, [result]
    for p in paths:
        if not Path(p).exists():
            raise ConfigError(f"{p}: no such file or folder")
    from ampfix.engine import datafiles

    from ampfix.engine.check import error_result

    problems: list = []
    files = list(discover(paths, cfg.root, cfg.all_excludes, cfg.respect_gitignore, problems))
    named_data = [p for p in paths if Path(p).is_file() and p not in {str(f) for f in files}]
    if not files and not problems and not named_data:
        click.echo(f"ampfix: warning: no Python files found under {', '.join(paths)}", err=True)
    jobs = [(str(f), codes) for f, codes in _codes_by_nearest_config(cfg, kw, files, selected)]
    cache = None
    if not fix and not kw.get("no_cache") and not os.environ.get("AMPFIX_NO_CACHE"):
        from ampfix.engine.cache import Cache

        cache = Cache()
    results = check_paths(jobs, cfg.settings, fix=fix, workers=kw["jobs"], cache=cache,
                          progress=_progress() if not kw.get("quiet") else None)
    results += [error_result(path, why) for path, why in problems]
    # dependency and environment files: read after the code, whose (fixed) imports they follow
    rules = datafiles.file_rules(rules_by_code()[c] for c in selected)
    from ampfix.project.parts import project_root

    others = datafiles.discover(paths, project_root(paths), rules, cfg.all_excludes) if rules else []
    if others:
        python = datafiles.python_texts(results, fixing=bool(fix))
        results += datafiles.check(others, lambda p: cfg.codes_for(p, selected), rules, python, paths, fix)
    return cfg, results


def _progress():
    """files done / total on stderr, when stderr is a terminal and the run takes a moment."""
    import time

    try:
        if not sys.stderr.isatty():
            return None
    except (AttributeError, ValueError):
        return None
    start = time.monotonic()
    shown = [False]

    def show(done: int, total: int) -> None:
        if done >= total:
            if shown[0]:
                sys.stderr.write("\r\x1b[2K")
                sys.stderr.flush()
            return
        if time.monotonic() - start < 0.5:
            return
        shown[0] = True
        sys.stderr.write(f"\rampfix: {done}/{total} files")
        sys.stderr.flush()

    return show


def _guard(kw, body):
    try:
        return body()
    except ConfigError as exc:
        click.echo(f"ampfix: error: {exc}", err=True)
        return EXIT_ERROR
    except BrokenPipeError:
        raise
    except Exception as exc:  # an internal error: one line unless --verbose
        stop = _stop_behind(exc)
        if stop is not None:  # raised while a Ctrl-C or SIGTERM unwound the run: that is what ended it
            raise stop from None
        if kw.get("verbose"):
            traceback.print_exc()
        else:
            click.echo(f"ampfix: internal error: {type(exc).__name__}: {exc} (run with --verbose for the traceback)",
                       err=True)
        return EXIT_ERROR


def _stop_behind(exc: BaseException):
    """The KeyboardInterrupt or SystemExit an exception was raised in the handling of, if any."""
    seen = set()
    cur = exc.__context__ or exc.__cause__
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, (KeyboardInterrupt, SystemExit)):
            return cur
        seen.add(id(cur))
        cur = cur.__context__ or cur.__cause__
    return None


class _Group(click.Group):
    """Ctrl-C exits 130 with one line (not click's "Aborted!" and 1, which reads as "problems
    found"); SIGTERM stops the workers too; a closed pipe (`ampfix check | head`) ends quietly."""

    def invoke(self, ctx):
        import signal

        def terminated(signum, frame):
            raise SystemExit(128 + signum)

        try:
            signal.signal(signal.SIGTERM, terminated)
        except ValueError:  # not the main thread (embedded use)
            pass
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            _stop_workers()
            try:
                sys.stderr.write("ampfix: interrupted\n")
            except OSError:
                pass
            sys.exit(130)
        except BrokenPipeError:
            _quiet_stdout()
            sys.exit(141)
        except SystemExit:
            _stop_workers()
            raise


def _stop_workers() -> None:
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()


def _quiet_stdout() -> None:
    """After the reader of stdout went away: further writes (and the flush at exit) go nowhere."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ampfix")
def main():
    """Find and fix mixed-precision mistakes in PyTorch training code."""


@main.command()
@_common
@click.option("--output-format", type=click.Choice(FORMATS), default="concise", show_default=True)
@click.option("--statistics", is_flag=True, help="Show a count of problems per rule instead of each one.")
@click.option("--no-cache", is_flag=True, help="Check every file afresh (do not read or write the result cache).")
@click.option("--quiet", "-q", is_flag=True, help="Print diagnostics only, no summary.")
@click.option("--fix", is_flag=True, help="Apply the safe fixes (as 'ampfix migrate --write').")
@click.option("--diff", is_flag=True, help="Show the fixes as a diff, change nothing (as 'ampfix migrate').")
@click.option("--unsafe-fixes", is_flag=True, help="With --fix or --diff: also the fixes that change behaviour.")
@click.option("--show-fixes", is_flag=True, help="List what the fixes do (with --fix: what they did).")
@click.option("--add-noqa", is_flag=True, help="Add '# noqa: CODE' to every line that has a problem now.")
@click.option("--show-settings", is_flag=True, help="Print the settings resolved for the first path, and where each "
                                                    "came from; check nothing.")
@click.option("--show-files", is_flag=True, help="Print the files that would be checked; check nothing.")
@click.option("--output-file", "-o", type=click.Path(dir_okay=False), help="Write the report to this file instead of "
                                                                          "standard output.")
@click.option("--exit-non-zero-on-fix", is_flag=True, help="With --fix: exit 1 when a file was changed, even if no "
                                                           "problem is left.")
def check(**kw):
    """Report problems in PATHS (files or folders; '-' reads standard input)."""
    if kw["show_settings"]:
        sys.exit(_guard(kw, lambda: _show_settings(kw)))
    if kw["show_files"]:
        sys.exit(_guard(kw, lambda: _show_files(kw)))
    if kw["fix"] or kw["diff"]:
        if kw["fix"] and kw["diff"]:
            click.echo("ampfix: error: --fix and --diff do not go together (--diff changes nothing)", err=True)
            sys.exit(EXIT_ERROR)
        kw["write"] = kw["fix"]
        sys.exit(_guard(kw, lambda: _migrate(kw)))
    if kw["unsafe_fixes"]:
        click.echo("ampfix: error: --unsafe-fixes goes with --fix or --diff", err=True)
        sys.exit(EXIT_ERROR)
    if kw["add_noqa"]:
        sys.exit(_guard(kw, lambda: _add_noqa(kw)))

    def body():
        from ampfix.output.report import show_fixes, statistics, statistics_json, summary_line, write_diagnostics

        cfg, results = run_paths(kw, fix=None)
        diags = sorted((d for r in results for d in r.diagnostics), key=lambda d: d.sort_key())
        import io

        out = io.StringIO() if kw["output_file"] else sys.stdout
        machine = kw["output_format"] in ("json", "github", "sarif", "gitlab")
        if kw["statistics"] and kw["output_format"] == "json":
            out.write(statistics_json(diags) + "\n")
        elif kw["statistics"] and kw["output_format"] not in ("sarif", "gitlab"):
            if diags:
                out.write(statistics(diags) + "\n")
        else:
            from ampfix.output.report import use_color

            write_diagnostics(results, diags, kw["output_format"], out,
                              color=not kw["output_file"] and use_color(sys.stdout))
        if kw["show_fixes"] and not machine:
            out.write(show_fixes(diags))
        if not kw["quiet"] and not machine:
            out.write(summary_line(diags) + "\n")
        if kw["output_file"]:
            tmp = kw["output_file"] + ".ampfix-tmp"
            try:  # whole or not at all
                with open(tmp, "w", encoding="utf-8") as fh:
                    fh.write(out.getvalue())
                os.replace(tmp, kw["output_file"])
            except OSError as exc:
                raise ConfigError(f"{kw['output_file']}: cannot write the report: {exc.strerror or exc}") from None
        return EXIT_PROBLEMS if diags and not kw["exit_zero"] else EXIT_OK

    sys.exit(_guard(kw, body))


def _show_settings(kw) -> int:
    """What ruff's --show-settings shows: the resolved settings for one file, and their sources."""
    cfg = _config(kw)
    first = (kw["paths"] or (".",))[0]
    s = cfg.settings
    selected = cfg.selected_codes()
    codes = cfg.codes_for(Path(first), selected) if first != "-" else selected
    scaler = 'torch.amp.GradScaler("cuda")' if s.target == "torch.amp" else "torch.cuda.amp.GradScaler()"
    lines = [
        f"Resolved settings for: {first}",
        f"config file:     {cfg.source if cfg.source else '(none found: defaults)'}",
        f"project root:    {cfg.root}",
        f"torch version:   {'.'.join(map(str, s.torch_version))}   (from: {s.torch_version_source})",
        f"target spelling: {s.target}   ({'set by --target/target' if s.target_setting else 'from the torch version'};"
        f" a GradScaler is written {scaler})",
        f"half precision:  {s.dtype}   ({'autocast alone, no GradScaler' if s.dtype == 'bfloat16' else 'autocast + GradScaler'})",
        f"unsafe fixes:    {cfg.unsafe_fixes}",
        f"respect .gitignore: {cfg.respect_gitignore}",
        f"exclude:         {', '.join(cfg.all_excludes) or '-'}",
        f"rules ({len(codes)}):      {', '.join(codes)}",
    ]
    click.echo("\n".join(lines))
    return EXIT_OK


def _show_files(kw) -> int:
    from ampfix.io.files import discover

    cfg = _config(kw)
    problems: list = []
    for f in discover(list(kw["paths"]) or ["."], cfg.root, cfg.all_excludes, cfg.respect_gitignore, problems):
        click.echo(str(f))
    for path, why in problems:
        click.echo(f"ampfix: {path}: {why}", err=True)
    return EXIT_OK


def _add_noqa(kw) -> int:
    from ampfix.engine.codes import ENGINE_CODES  # not silenced by a noqa: fix what they say
    from ampfix.engine.noqa import add_noqa
    from ampfix.model.source import SourceError
    from ampfix.io.writer import WriteError, digest, write_atomic

    if tuple(kw["paths"]) == ("-",):
        raise ConfigError("--add-noqa writes files: name them (not '-')")
    kw["no_cache"] = True
    cfg, results = run_paths(kw, fix=None)
    added = files = 0
    failed = False
    for r in results:
        lines: dict = {}
        for d in r.diagnostics:
            if d.code not in ENGINE_CODES and d.path == r.path and r.path.endswith((".py", ".pyi")):
                lines.setdefault(d.line, set()).add(d.code)
        if not lines:
            if r.path.endswith(".ipynb") and r.diagnostics:
                click.echo(f"{r.path}: no noqa added: notebooks are not edited by --add-noqa (add the comments in "
                           "the cells)", err=True)
            continue
        try:
            with open(r.path, "rb") as fh:
                data = fh.read()
            new, n, skipped = add_noqa(data, r.path, lines)
            if n:
                write_atomic(r.path, new, expected=r.digest or digest(data))
                added += n
                files += 1
        except (OSError, SourceError, WriteError) as exc:
            click.echo(f"{r.path}: error: {getattr(exc, 'message', None) or exc}", err=True)
            failed = True
            continue
        for line in skipped:
            click.echo(f"{r.path}:{line}: no noqa added: the line ends inside a string or a continuation", err=True)
    click.echo(f"Added {added} noqa directive{'s' if added != 1 else ''} to {files} file{'s' if files != 1 else ''}.",
               err=True)
    return EXIT_ERROR if failed else EXIT_OK


@main.command()
@_common
@click.option("--write", "-w", is_flag=True, help="Apply the fixes to the files (default: show a diff).")
@click.option("--unsafe-fixes", is_flag=True, help="Also apply fixes that change behaviour.")
@click.option("--quiet", "-q", is_flag=True, help="No per-file report.")
@click.option("--exit-non-zero-on-fix", is_flag=True, help="With --write: exit 1 when a file was changed, even if "
                                                           "no problem is left.")
def migrate(**kw):
    """Rewrite PATHS: show the diff of every safe fix, or apply them with --write."""
    kw.setdefault("show_fixes", False)
    sys.exit(_guard(kw, lambda: _migrate(kw)))


def _migrate(kw) -> int:
    from ampfix.output.report import migrate_report, unified_diff
    from ampfix.io.writer import write_all

    cfg, results = run_paths(kw, fix="unsafe" if kw["unsafe_fixes"] else "config")
    out = sys.stdout
    if kw["paths"] == ("-",):
        from ampfix.engine.check import IO_ERROR, SYNTAX_ERROR

        r = results[0]
        # always the whole text: fixed, or as it came when nothing applies or it cannot be read
        sys.stdout.buffer.write(r.fixed_bytes if r.changed and r.fixed_bytes is not None else r.input)
        sys.stdout.buffer.flush()
        for d in r.diagnostics:
            click.echo(f"{d.path}:{d.line}:{d.col}: {d.code} {d.message}", err=True)
        if any(d.code in (SYNTAX_ERROR[0], IO_ERROR[0]) for d in r.diagnostics):
            return EXIT_ERROR
        return EXIT_OK if not r.diagnostics or kw["exit_zero"] else EXIT_PROBLEMS
    changed = [r for r in results if r.changed]
    failed = []
    if kw["write"]:
        failed = write_all(changed)
        changed = [r for r in changed if r not in failed]
    else:
        for r in changed:
            out.write(unified_diff(r))
        out.flush()  # the diff before the report, on a terminal too
    if not kw["quiet"]:
        err = sys.stderr
        migrate_report(results, kw["write"], err)
        n = len(changed)
        left = sum(len(r.diagnostics) for r in results)
        verb = "Rewrote" if kw["write"] else "Would rewrite"
        err.write(f"{verb} {n} file{'s' if n != 1 else ''}; {left} problem{'s' if left != 1 else ''} left for a person.\n")
    remaining = any(r.diagnostics for r in results)
    dirty = bool(changed) and (not kw["write"] or kw.get("exit_non_zero_on_fix"))
    if failed or any(r.error and not r.error.startswith("skipped") for r in results):
        return EXIT_ERROR  # some files could not be read or written (each one is named above)
    return EXIT_PROBLEMS if (remaining or dirty) and not kw["exit_zero"] else EXIT_OK


def _register_tools() -> None:
    from ampfix import cli_tools

    for name in ("clean", "rules_cmd", "explain", "server", "convert_checkpoint", "verify"):
        main.add_command(getattr(cli_tools, name))


_register_tools()


if __name__ == "__main__":  # pragma: no cover
    main()
