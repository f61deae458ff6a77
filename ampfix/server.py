"""``ampfix server``: a Language Server Protocol server over stdio (pygls), a front end like the CLI.

What it does for an open document (the editor's text, not the file on disk):

* diagnostics on open, change (debounced, a stale run's result dropped) and save, each with
  its code, message, severity, range and a link to the rule's section of docs/rules.md;
* code actions: a quick fix per diagnostic that has one (unsafe ones only when the settings
  allow unsafe fixes, and labelled so), "fix all" (``source.fixAll.ampfix``), "add ``# noqa``";
  the apex migration is planned over the workspace folder as ``ampfix migrate`` plans a project,
  and its quick fix is a WorkspaceEdit over every file the plan touches, or is not offered, with
  the reason;
* hover on a diagnostic: the rule's explanation, short.

Settings: the nearest pyproject.toml / ampfix.toml of each document, with the client's
``initializationOptions`` (``select``, ``ignore``, ``extendSelect``, ``unsafeFixes``,
``torchVersion``, ``target``) on top; a configuration file saved or changed in the workspace is
read again without a restart.
"""
from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from lsprotocol import types as T
from pygls.lsp.server import LanguageServer
from pygls.uris import from_fs_path, to_fs_path

from ampfix.engine.check import check_source
from ampfix.io.config import Config, ConfigError, apply_overrides, load_config
from ampfix.model.diagnostic import Diagnostic, FileResult
from ampfix.registry import rules_by_code
from ampfix.version import __version__

#: seconds a burst of keystrokes has to be quiet before the document is checked
DEBOUNCE = 0.15
CONFIG_FILES = ("pyproject.toml", "ampfix.toml")
FIX_ALL = "source.fixAll.ampfix"
_DOCS: list = []


def docs_uri() -> str:
    """Where an editor opens a rule's documentation: the rules' reference written once, for the
    rules this ampfix has, into its cache directory (a file: URI that works offline and never
    names a page that does not exist)."""
    if not _DOCS:
        from ampfix.engine.cache import default_dir
        from ampfix.output.report import rules_markdown

        from ampfix.version import __version__

        path = default_dir() / f"rules-{__version__}.md"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            text = rules_markdown()
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
            _DOCS.append(path.resolve().as_uri())
        except OSError:
            _DOCS.append("")
    return _DOCS[0]


class AmpfixServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("ampfix", __version__, text_document_sync_kind=T.TextDocumentSyncKind.Incremental,
                         notebook_document_sync=T.NotebookDocumentSyncOptions(notebook_selector=[
                             T.NotebookDocumentFilterWithCells(cells=[T.NotebookCellLanguage(language="python")],
                                                               notebook="jupyter-notebook")], save=True))
        self.options: dict = {}
        self.pending: Dict[str, asyncio.Task] = {}
        self.configs: Dict[Path, Tuple[Config, List[str]]] = {}
        self.last: Dict[str, Tuple[int, FileResult]] = {}  # uri -> (version, result)

    # ------------------------------------------------------------------ settings
    def config_for(self, path: str) -> Tuple[Config, List[str]]:
        """The nearest configuration of a document with the client's options on top, and its codes."""
        folder = Path(path).parent
        if folder not in self.configs:
            o = self.options
            cfg = load_config(None, start=folder if folder.is_dir() else Path.cwd())
            cfg = apply_overrides(cfg, folder, select=o.get("select"), extend_select=o.get("extendSelect"),
                                  ignore=o.get("ignore"), target=o.get("target"),
                                  torch_version=o.get("torchVersion"), dtype=o.get("dtype"),
                                  origin="initializationOptions: ")
            if o.get("unsafeFixes") is not None:
                cfg.unsafe_fixes = bool(o["unsafeFixes"])
            self.configs[folder] = (cfg, cfg.codes_for(Path(path), cfg.selected_codes()))
        return self.configs[folder]

    # ------------------------------------------------------------------ checking
    def check(self, uri: str, text: str, fix: Optional[str] = None, codes: Optional[List[str]] = None,
              notebook: bool = False) -> FileResult:
        path = to_fs_path(uri) or uri
        cfg, selected = self.config_for(path)
        use = selected if codes is None else [c for c in codes if c in rules_by_code()]
        rules = [rules_by_code()[c] for c in use]
        data = text.encode("utf-8")
        if notebook or path.endswith(".ipynb"):
            from ampfix.engine.check import check_notebook

            return check_notebook(data, path, rules, cfg.settings, fix)
        return check_source(data, path, rules, cfg.settings, fix)

    def schedule(self, uri: str, delay: float) -> None:
        old = self.pending.pop(uri, None)
        if old is not None:
            old.cancel()
        self.pending[uri] = asyncio.get_event_loop().create_task(self._publish_later(uri, delay))

    async def _publish_later(self, uri: str, delay: float) -> None:
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            return
        if uri in self.workspace.notebook_documents:
            await self._publish_notebook(uri)
            return
        doc = self.workspace.get_text_document(uri)
        version, text = doc.version, doc.source
        loop = asyncio.get_event_loop()
        try:
            result = await loop.run_in_executor(None, self.check, uri, text)
        except ConfigError as exc:
            self.window_show_message(T.ShowMessageParams(type=T.MessageType.Error, message=f"ampfix: {exc}"))
            return
        except Exception as exc:  # never a crash, never a stale list: say so and keep the old one
            self.window_log_message(T.LogMessageParams(type=T.MessageType.Error,
                                                       message=f"ampfix: internal error on {uri}: {exc!r}"))
            return
        current = self.workspace.text_documents.get(uri)
        if current is None or current.version != version:
            return  # typed on meanwhile: the newer run publishes
        self.last[uri] = (version, result)
        self.text_document_publish_diagnostics(T.PublishDiagnosticsParams(
            uri=uri, version=version, diagnostics=[lsp_diagnostic(d) for d in result.diagnostics]))


    async def _publish_notebook(self, uri: str) -> None:
        """A notebook (LSP 3.17 notebook documents): its code cells checked as one module, as
        ``ampfix check`` reads an .ipynb, and each cell gets its own diagnostics."""
        import json

        nb = self.workspace.get_notebook_document(notebook_uri=uri)
        if nb is None:
            return
        version = nb.version
        cells = [c for c in nb.cells if c.kind == T.NotebookCellKind.Code]
        sources = [self.workspace.get_text_document(c.document).source for c in cells]
        book = {"cells": [{"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None}
                          for s in sources], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
        loop = asyncio.get_event_loop()
        result = await loop.run_in_executor(None, lambda: self.check(uri, json.dumps(book), notebook=True))
        current = self.workspace.get_notebook_document(notebook_uri=uri)
        if current is None or current.version != version:
            return
        per_cell: Dict[str, List[T.Diagnostic]] = {c.document: [] for c in cells}
        for d in result.diagnostics:
            if d.cell is not None and 1 <= d.cell <= len(cells):
                per_cell[cells[d.cell - 1].document].append(lsp_diagnostic(d))
        for cell_uri, diags in per_cell.items():
            self.text_document_publish_diagnostics(T.PublishDiagnosticsParams(uri=cell_uri, diagnostics=diags))


server = AmpfixServer()


def lsp_diagnostic(d: Diagnostic) -> T.Diagnostic:
    from ampfix.engine.codes import ENGINE_CODES

    end_line = max(d.end_line, d.line)
    end_col = d.end_col if (end_line, d.end_col) > (d.line, d.col) else d.col + 1
    return T.Diagnostic(
        range=T.Range(start=T.Position(line=d.line - 1, character=d.col - 1),
                      end=T.Position(line=end_line - 1, character=end_col - 1)),
        message=d.message, code=d.code, source="ampfix",
        severity=T.DiagnosticSeverity.Error if d.code in ENGINE_CODES else T.DiagnosticSeverity.Warning,
        code_description=T.CodeDescription(href=f"{docs_uri()}#{d.code.lower()}") if docs_uri() else None,
        data={"fix": d.fix, "fix_description": d.fix_description})


# ---------------------------------------------------------------------- document events
@server.feature(T.INITIALIZE)
def initialize(ls: AmpfixServer, params: T.InitializeParams) -> None:
    ls.options = dict(params.initialization_options or {})


@server.feature(T.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: AmpfixServer, params: T.DidOpenTextDocumentParams) -> None:
    ls.schedule(params.text_document.uri, 0)


@server.feature(T.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: AmpfixServer, params: T.DidChangeTextDocumentParams) -> None:
    ls.schedule(params.text_document.uri, DEBOUNCE)


@server.feature(T.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: AmpfixServer, params: T.DidSaveTextDocumentParams) -> None:
    uri = params.text_document.uri
    if (to_fs_path(uri) or "").endswith(CONFIG_FILES):
        _config_changed(ls)
    else:
        ls.schedule(uri, 0)


@server.feature(T.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: AmpfixServer, params: T.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    task = ls.pending.pop(uri, None)
    if task is not None:
        task.cancel()
    ls.last.pop(uri, None)
    ls.text_document_publish_diagnostics(T.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


@server.feature(T.NOTEBOOK_DOCUMENT_DID_OPEN)
def notebook_open(ls: AmpfixServer, params: T.DidOpenNotebookDocumentParams) -> None:
    ls.schedule(params.notebook_document.uri, 0)


@server.feature(T.NOTEBOOK_DOCUMENT_DID_CHANGE)
def notebook_change(ls: AmpfixServer, params: T.DidChangeNotebookDocumentParams) -> None:
    ls.schedule(params.notebook_document.uri, DEBOUNCE)


@server.feature(T.NOTEBOOK_DOCUMENT_DID_SAVE)
def notebook_save(ls: AmpfixServer, params: T.DidSaveNotebookDocumentParams) -> None:
    ls.schedule(params.notebook_document.uri, 0)


@server.feature(T.WORKSPACE_DID_CHANGE_WATCHED_FILES)
def watched(ls: AmpfixServer, params: T.DidChangeWatchedFilesParams) -> None:
    if any((to_fs_path(c.uri) or "").endswith(CONFIG_FILES) for c in params.changes):
        _config_changed(ls)


def _config_changed(ls: AmpfixServer) -> None:
    """A configuration file changed: every open document is checked again with it."""
    ls.configs.clear()
    for uri in list(ls.workspace.text_documents):
        if uri.endswith((".py", ".pyi", ".ipynb")):
            ls.schedule(uri, 0)


# ---------------------------------------------------------------------- hover
@server.feature(T.TEXT_DOCUMENT_HOVER)
def hover(ls: AmpfixServer, params: T.HoverParams) -> Optional[T.Hover]:
    got = ls.last.get(params.text_document.uri)
    if got is None:
        return None
    line, ch = params.position.line + 1, params.position.character + 1
    for d in got[1].diagnostics:
        if (d.line, d.col) <= (line, ch) <= (max(d.end_line, d.line), max(d.end_col, d.col + 1)):
            return T.Hover(contents=T.MarkupContent(kind=T.MarkupKind.Markdown, value=explanation(d.code)))
    return None


def explanation(code: str, limit: int = 40) -> str:
    """What ``ampfix explain CODE`` says, short enough for a hover."""
    from ampfix.engine.codes import ENGINE_CODES

    if code in ENGINE_CODES:
        e = ENGINE_CODES[code]
        return f"**{e.code} {e.name}**: {e.summary}\n\n{e.doc}"
    rule = rules_by_code()[code]
    doc = rule.documentation().strip().splitlines()
    text = "\n".join(doc[:limit]) + ("\n\n..." if len(doc) > limit else "")
    return f"**{rule.code} {rule.name}**: {rule.summary}\n\n{text}\n\n`ampfix explain {rule.code}` for the rest"


# ---------------------------------------------------------------------- code actions
@server.feature(T.TEXT_DOCUMENT_CODE_ACTION,
                T.CodeActionOptions(code_action_kinds=[T.CodeActionKind.QuickFix, FIX_ALL]))
async def code_action(ls: AmpfixServer, params: T.CodeActionParams) -> List[T.CodeAction]:
    uri = params.text_document.uri
    doc = ls.workspace.get_text_document(uri)
    text = doc.source
    path = to_fs_path(uri) or uri
    cfg, _ = ls.config_for(path)
    unsafe_ok = cfg.unsafe_fixes
    loop = asyncio.get_event_loop()
    actions: List[T.CodeAction] = []
    only = params.context.only
    want_quick = not only or any(k.startswith("quickfix") for k in only)
    want_all = not only or any(FIX_ALL.startswith(k) or k.startswith(FIX_ALL) for k in only)
    for diag in params.context.diagnostics if want_quick else []:
        if diag.source != "ampfix" or not isinstance(diag.code, str):
            continue
        data = diag.data if isinstance(diag.data, dict) else {}
        kind = data.get("fix")
        action = None
        if _planned(diag.code):  # a migration: planned over the workspace folder, whatever one file says
            action = await loop.run_in_executor(None, _migration_action, ls, uri, text, diag, unsafe_ok)
        elif kind and (kind == "safe" or unsafe_ok):
            action = await loop.run_in_executor(None, _rule_action, ls, uri, text, diag, kind)
        if action is not None:
            actions.append(action)
        actions.append(_noqa_action(uri, text, diag))
    if want_all:
        fixed = await loop.run_in_executor(None, lambda: ls.check(uri, text, "unsafe" if unsafe_ok else "safe"))
        if fixed.changed:
            actions.append(T.CodeAction(title="ampfix: fix all auto-fixable problems", kind=FIX_ALL,
                                        edit=_replace_all(uri, text, fixed.fixed, doc.version)))
    return actions


def _planned(code: str) -> bool:
    """Whether the rule's fixes come from a plan made over a project (the apex migration)."""
    rule = rules_by_code().get(code)
    return rule is not None and getattr(rule, "planner", None) is not None


def _whole_text(old: str, new: str) -> T.TextEdit:
    """``new`` in place of the whole of ``old`` (LSP positions count UTF-16 code units)."""
    lines = old.split("\n")
    end = T.Position(line=len(lines) - 1, character=len(lines[-1].encode("utf-16-le")) // 2)
    return T.TextEdit(range=T.Range(start=T.Position(line=0, character=0), end=end), new_text=new)


def _replace_all(uri: str, old: str, new: str, version: Optional[int] = None) -> T.WorkspaceEdit:
    edit = _whole_text(old, new)
    if version is not None:
        return T.WorkspaceEdit(document_changes=[T.TextDocumentEdit(
            text_document=T.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version), edits=[edit])])
    return T.WorkspaceEdit(changes={uri: [edit]})


def _rule_action(ls: AmpfixServer, uri: str, text: str, diag: T.Diagnostic, kind: str) -> Optional[T.CodeAction]:
    """The fixes of this rule in the document, as ``ampfix migrate --write --select CODE`` makes them."""
    result = ls.check(uri, text, "unsafe" if kind != "safe" else "safe", codes=[diag.code])
    if not result.changed:
        return None
    data = diag.data if isinstance(diag.data, dict) else {}
    what = data.get("fix_description") or "apply the fix"
    label = f"ampfix: {what}" + (" (unsafe: changes behaviour)" if kind != "safe" else "")
    return T.CodeAction(title=label, kind=T.CodeActionKind.QuickFix, diagnostics=[diag], is_preferred=kind == "safe",
                        edit=_replace_all(uri, text, result.fixed))


def _migration_action(ls: AmpfixServer, uri: str, text: str, diag: T.Diagnostic, unsafe_ok: bool):
    """The apex migration, planned over the workspace folder as ``ampfix migrate --write`` plans a
    project: a WorkspaceEdit over every file it touches, or a disabled action that says why."""
    path = to_fs_path(uri) or uri
    title = "ampfix: migrate apex to torch.amp (every file of the migration)"
    try:
        on_disk = Path(path).read_text(encoding="utf-8")
    except OSError:
        on_disk = None
    if on_disk != text:
        return T.CodeAction(title=title, kind=T.CodeActionKind.QuickFix, diagnostics=[diag],
                            disabled=T.CodeActionDisabled(reason="save the file first: the migration is planned "
                                                                     "over the files on disk, as `ampfix migrate`"))
    folder = _workspace_folder(ls, path)
    changes = migrate_folder(folder, "unsafe" if unsafe_ok else "safe", ls.options)
    if path not in changes:
        return T.CodeAction(title=title, kind=T.CodeActionKind.QuickFix, diagnostics=[diag],
                            disabled=T.CodeActionDisabled(reason=changes.get("", "the migration does not change "
                                                                                     "this file (see `ampfix migrate`)")))
    edits = {from_fs_path(p): [_whole_text(old, new)] for p, (old, new) in changes.items() if p}
    return T.CodeAction(title=title, kind=T.CodeActionKind.QuickFix, diagnostics=[diag], is_preferred=True,
                        edit=T.WorkspaceEdit(changes=edits))


def _workspace_folder(ls: AmpfixServer, path: str) -> str:
    best = None
    for folder in ls.workspace.folders.values():
        root = to_fs_path(folder.uri) or ""
        if root and (path == root or path.startswith(root.rstrip(os.sep) + os.sep)):
            if best is None or len(root) > len(best):
                best = root
    return best or (to_fs_path(ls.workspace.root_uri) if ls.workspace.root_uri else str(Path(path).parent))


def migrate_folder(folder: str, fix: str, options: dict) -> Dict[str, Tuple[str, str]]:
    """path -> (old text, new text) for every Python file ``ampfix migrate --write`` would change
    in ``folder`` (the same discovery, configuration and planning); "" -> why, when none."""
    from ampfix.engine.run import check_paths
    from ampfix.io.files import discover

    cfg = apply_overrides(load_config(None, start=Path(folder)), Path(folder), select=options.get("select"),
                          extend_select=options.get("extendSelect"), ignore=options.get("ignore"),
                          target=options.get("target"), torch_version=options.get("torchVersion"),
                          dtype=options.get("dtype"), origin="initializationOptions: ")
    selected = cfg.selected_codes()
    files = list(discover([folder], cfg.root, cfg.all_excludes, cfg.respect_gitignore, []))
    # in this process (workers=1): no worker processes forked from the server's threads
    results = check_paths([(str(f), cfg.codes_for(f, selected)) for f in files], cfg.settings, fix=fix, workers=1)
    out = {r.path: (r.original, r.fixed) for r in results if r.changed}
    if not out:
        out[""] = "the migration changes nothing in the workspace folder"
    return out


def _noqa_action(uri: str, text: str, diag: T.Diagnostic) -> T.CodeAction:
    from ampfix.engine.noqa import add_noqa

    line = diag.range.start.line + 1
    new, n, skipped = add_noqa(text.encode("utf-8"), to_fs_path(uri) or uri, {line: [str(diag.code)]})
    action = T.CodeAction(title=f"ampfix: add `# noqa: {diag.code}` on this line", kind=T.CodeActionKind.QuickFix,
                          diagnostics=[diag])
    if n:
        action.edit = _replace_all(uri, text, new.decode("utf-8"))
    else:
        action.disabled = T.CodeActionDisabled(
            reason="this line ends inside a string or a continuation" if skipped else "already silenced")
    return action


def main() -> None:
    server.start_io()
