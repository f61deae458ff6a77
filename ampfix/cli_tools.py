"""The commands beside the linter's own (check, migrate, in :mod:`ampfix.cli`): rules, explain,
clean, the language server, convert-checkpoint and verify.  Registered on the ``ampfix`` group by
:mod:`ampfix.cli`."""
from __future__ import annotations

import os
import sys

import click

from ampfix.exits import EXIT_ERROR, EXIT_OK, EXIT_PROBLEMS


@click.command()
def clean():
    """Remove ampfix's result cache ($AMPFIX_CACHE_DIR, else ~/.cache/ampfix)."""
    from ampfix.engine.cache import clean as clean_cache, default_dir

    n = clean_cache()
    click.echo(f"Removed {n} cache file{'s' if n != 1 else ''} from {default_dir()}.")


@click.command("rules")
@click.option("--output-format", type=click.Choice(["table", "json", "markdown"]), default="table", show_default=True)
def rules_cmd(output_format):
    """List every rule: code, name, fix, on by default (markdown: the whole documentation)."""
    import json

    from ampfix.registry import all_rules

    if output_format == "markdown":
        from ampfix.output.report import rules_markdown

        click.echo(rules_markdown(), nl=False)
        return
    rows = [(r.code, r.name, r.fix_kind or "-", "yes" if r.default else "no", r.summary) for r in all_rules()]
    if output_format == "json":
        click.echo(json.dumps([{"code": r.code, "name": r.name, "fix": r.fix_kind, "default": bool(r.default),
                                "summary": r.summary} for r in all_rules()], indent=2))
        return
    w = max(len(r[1]) for r in rows)
    click.echo(f"{'code':7} {'name':{w}} {'fix':9} {'default':7} summary")
    for code, name, fix, default, summary in rows:
        click.echo(f"{code:7} {name:{w}} {fix:9} {default:7} {summary}")


@click.command()
@click.argument("code")
def explain(code):
    """Show a rule's documentation: what, why, example, use instead (CODE: AMP301...)."""
    from ampfix.registry import rules_by_code

    from ampfix.engine.codes import ENGINE_CODES

    rule = rules_by_code().get(code.strip().upper())
    engine = ENGINE_CODES.get(code.strip().upper())
    if engine is not None:
        click.echo(f"# {engine.code} {engine.name}\n\n{engine.summary}\n\nReported by the engine itself, always on "
                   f"(it cannot be selected or ignored).\n\n{engine.doc}")
        return
    if rule is None:
        click.echo(f"ampfix: error: unknown rule {code!r} (see 'ampfix rules')", err=True)
        sys.exit(EXIT_ERROR)
    fix = {"safe": "safe fix", "unsafe": "unsafe fix (applied with --unsafe-fixes)",
           "sometimes": "safe or unsafe fix, depending on the case", None: "no automatic fix"}[rule.fix_kind]
    click.echo(f"# {rule.code} {rule.name}\n")
    click.echo(f"{rule.summary}\n")
    click.echo(f"Fix: {fix}.  On by default: {'yes' if rule.default else 'no'}.  Advice holds from torch {rule.since}.\n")
    click.echo(rule.documentation())


@click.command()
def server():
    """Run the language server over stdio (editors: see the README).  Needs pygls:
    pip install "ampfix[server]"."""
    try:
        from ampfix.server import main as serve
    except ImportError as exc:
        click.echo(f"ampfix: error: ampfix server needs pygls and lsprotocol ({exc.name} is missing): "
                   "pip install 'ampfix[server]'", err=True)
        sys.exit(EXIT_ERROR)
    serve()


@click.command("convert-checkpoint")
@click.argument("old", type=click.Path())
@click.argument("new", type=click.Path())
@click.option("--model-key", help="The key of the model's state dict in the checkpoint (when several hold float16).")
def convert_checkpoint(old, new, model_key):
    """Convert a checkpoint an apex program wrote (amp loss scaler, FP16_Optimizer state, float16
    weights with float32 masters) for the migrated program.  Needs torch; never runs pickled code."""
    from ampfix.migration.checkpoint import ConvertError, convert_file

    if os.path.abspath(old) == os.path.abspath(new):
        click.echo("ampfix: error: write the converted checkpoint to a new file (NEW must differ from OLD)", err=True)
        sys.exit(EXIT_ERROR)
    try:
        report = convert_file(old, new, model_key)
    except ConvertError as exc:
        click.echo(f"ampfix: error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    click.echo(f"{old} -> {new}")
    for line in report:
        click.echo(f"  {line}")


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("script", type=click.Path())
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--steps", type=int, default=50, show_default=True, help="Optimizer steps to run, then stop the script.")
@click.option("--warmup", type=int, default=5, show_default=True, help="Steps left out of timing and memory.")
@click.option("--timeout", type=float, default=600, show_default=True, help="Seconds allowed for each run.")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True,
              help="cpu checks the plumbing with CPU autocast; the figures mean something only on a GPU.")
@click.option("--original", type=click.Path(exists=True), help="The pre-migration script, run as a third mode.")
@click.option("--migrate", "do_migrate", is_flag=True, help="Migrate SCRIPT in memory (a temporary file) and verify that.")
@click.option("--unsafe-fixes", "unsafe_fixes", is_flag=True, help="With --migrate: also the fixes that change "
                                                                   "behaviour (as 'migrate --unsafe-fixes').")
@click.option("--nproc", type=int, default=1, show_default=True, help="Launch through torchrun with this many processes.")
@click.option("--rtol", type=float, default=0.10, show_default=True, help="Relative loss tolerance against fp32.")
@click.option("--atol", "atol_frac", type=float, default=0.02, show_default=True,
              help="Absolute loss tolerance, as a fraction of the first fp32 loss.")
@click.option("--no-profile", is_flag=True, help="Do not run the profiler's anti-pattern matcher.")
@click.option("--watch-dtypes", is_flag=True, help="Record the dtypes nn.Linear layers compute in (DataParallel check).")
@click.option("--json", "json_path", type=click.Path(), help="Write the full report as JSON ('-' for stdout).")
@click.option("--plot", "plot_path", type=click.Path(), help="Write loss curves and step times as a PNG (matplotlib).")
def verify(script, script_args, steps, warmup, timeout, device, original, do_migrate, unsafe_fixes, nproc, rtol, atol_frac,
           no_profile, watch_dtypes, json_path, plot_path):
    """Run SCRIPT on the GPU as written (amp) and with AMP forced off (fp32), and compare.

    Arguments after SCRIPT (or after --) go to the script.
    """
    import json
    import os
    import tempfile

    from ampfix.verify import Options, VerifyError, format_report, plot, verify as run_verify

    opts = Options(steps=steps, warmup=warmup, timeout=timeout, device=device, rtol=rtol, atol_frac=atol_frac,
                   nproc=nproc, profile=not no_profile, watch_dtypes=watch_dtypes)
    args = list(script_args)
    if args[:1] == ["--"]:
        args = args[1:]
    tmp = None
    try:
        target = script
        if do_migrate:
            from ampfix.engine.check import check_source
            from ampfix.registry import all_rules
            from ampfix.model.settings import Settings

            with open(script, "rb") as fh:
                res = check_source(fh.read(), script, all_rules(), Settings(), fix="unsafe" if unsafe_fixes else "safe")
            left = [d for d in res.diagnostics if d.code in ("AMP101", "AMP102")]
            if left:
                click.echo(f"ampfix: warning: the migration left apex in {script} ({left[0].code} line {left[0].line}: "
                           f"{'needs --unsafe-fixes' if left[0].fix == 'unsafe' else left[0].message}): the "
                           "result still imports apex", err=True)
            fd, tmp = tempfile.mkstemp(prefix=".ampfix-verify-", suffix=".py", dir=os.path.dirname(os.path.abspath(script)))
            with os.fdopen(fd, "wb") as fh:
                fh.write(res.fixed_bytes if res.fixed_bytes is not None else b"")
            target = tmp
            original = original or script
        rep = run_verify(target, args, opts, original=original)
        rep["script"] = script + (" (migrated in memory)" if do_migrate else "")
        # with --json -, stdout is the JSON alone; the report goes to stderr
        click.echo(format_report(rep), err=json_path == "-")
        if json_path == "-":
            click.echo(json.dumps(rep, indent=2))
        elif json_path:
            with open(json_path, "w") as fh:
                json.dump(rep, fh, indent=2)
        if plot_path:
            plot(rep, plot_path)
        sys.exit(EXIT_OK if rep["verdict"]["pass"] else EXIT_PROBLEMS)
    except VerifyError as exc:
        click.echo(f"ampfix: error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)

