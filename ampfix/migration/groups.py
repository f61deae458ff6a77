"""What one migration group changes: :class:`Group` (everything that must change together),
:class:`FileChanges` (its edits to one module) and :class:`Refuse` (why it cannot be done)."""
from __future__ import annotations

import ast
import re
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Set, Tuple

from ampfix.model.edits import Builder, Conflict, Edit, house_quote, requote
from ampfix.rule import ImportSpec
from ampfix.engine.tidy import Remover, apex_comment_above
from ampfix.model.semantic import block_of

#: a parenthesis in a comment about where apex's initialize must come
_ORDERING_NOTE = re.compile(r"\s*\([^()]*\bapex\b[^()]*initiali[sz][^()]*\)", re.IGNORECASE)


class Refuse(Exception):
    """The group cannot be migrated with confidence: the reason, for the person."""


class FileChanges:
    """The edits one group makes to one module."""

    def __init__(self, module) -> None:
        self.module = module
        self.src = module.src
        self.b = Builder(module.src)
        self._inserts: Dict[Tuple[int, str], List[str]] = {}  # (offset, indent) -> lines, in order
        self.edits: List[Edit] = []
        self.removed: List[ast.stmt] = []
        self.adds: List[ImportSpec] = []
        self.removes: List[ImportSpec] = []
        self.touched: Set[int] = set()  # id of statements replaced or removed
        self._filled: List[ast.stmt] = []  # statements something is inserted beside (their block stays)
        self.described: Set[int] = set()  # ids of removed statements whose apex comment above goes too
        self.obsolete: Set[int] = set()  # ids of removed statements whose own comments go with them
        self.helpers: Set[str] = set()  # the module helpers added (add_module_helper)
        #: where the first helper's lines went (the list, its trailing blank lines): the next go there
        self.helper_slot: Optional[Tuple[List[str], int]] = None
        self._stale_lines: Set[int] = set()  # comment lines of commented-out code that read what went
        #: ids of ``if`` statements whose test the scaler made right before them evaluates
        self.tests_moved: Set[int] = set()
        self._before: Dict[int, ast.stmt] = {}  # offset of an insert_before -> the statement it precedes

    def _claim(self, node) -> None:
        if id(node) in self.touched:
            raise Refuse(f"line {node.lineno} would be rewritten twice")
        self.touched.add(id(node))

    def replace(self, node, text: str) -> None:
        self._claim(node)
        self.edits.append(self.b.replace(node, text))

    def replace_statement(self, stmt, lines: Sequence[str]) -> None:
        self._claim(stmt)
        self.edits.append(self._safe(lambda: self.b.replace_statement(stmt, lines)))

    def insert_before(self, stmt, lines: Sequence[str]) -> None:
        self._filled.append(stmt)
        at = self.src.starts[self.b.first_line(stmt) - 1]
        self._before.setdefault(at, stmt)
        self._inserts.setdefault((at, self.b.indent(stmt)), []).extend(lines)

    def inserted_before(self, stmt) -> bool:
        """Whether lines are to be inserted where ``stmt`` starts."""
        return self.src.starts[self.b.first_line(stmt) - 1] in self._before

    def insert_after(self, stmt, lines: Sequence[str], indent: Optional[str] = None) -> None:
        # after the last statement of its line (`clip(...); opt.step()` too): the new lines follow
        # that line, in the same block; something after it on the line would run before them
        end_col = self.src.char_col(stmt.end_lineno, stmt.end_col_offset)
        rest = self.src.line_text(stmt.end_lineno)[end_col:].strip()
        if (rest and not rest.startswith("#")) or (stmt.end_lineno == stmt.lineno and self.b.first_line(stmt) == stmt.lineno
                                                   and self.src.line_text(stmt.lineno).rstrip().endswith(":")):
            raise Refuse(f"line {stmt.end_lineno} holds more than one statement after `{self.src.code(stmt)[:40]}`")
        at = self.src.line_end(stmt.end_lineno)
        if indent is None:
            self._filled.append(stmt)
        self._inserts.setdefault((at, self.b.indent(stmt) if indent is None else indent), []).extend(lines)

    def restate_inserted(self, old: str, new: str) -> None:
        """An inserted line says ``new`` instead of ``old`` (a scaler two seeds share)."""
        lines = next(v for v in self._inserts.values() if old in v)
        lines[lines.index(old)] = new

    def remove(self, stmt, described: bool = False, obsolete: bool = False) -> None:
        """``described``: comment lines right above that speak of apex go with the statement.
        ``obsolete``: the statement is code the migration made pointless (the fp16 path's own
        warm-up): the comments inside it described it and go with it, as do those right above."""
        self._claim(stmt)
        self.removed.append(stmt)
        if described:
            self.described.add(id(stmt))
        if obsolete:
            self.obsolete.add(id(stmt))

    def drop_comment_above(self, stmt, named: bool = False) -> None:
        """The comment lines right above a statement that stays go when they speak of apex (``# use
        apex fp16 optimizer`` above the block whose initialize went); ``named``: only when they
        name apex itself (``# https://nvidia.github.io/apex/amp.html#checkpointing`` above a
        checkpoint line that now saves the GradScaler: ``# save amp state`` still holds there;
        ``# `--amp` chooses native amp before apex`` above an ``if`` whose apex branch went), and
        then only where no other edit touches them."""
        line = self.b.first_line(stmt)
        first = apex_comment_above(self.src, line)
        if first is None:
            return
        if named:
            if any("apex" in self.src.line_text(n).lower() for n in range(first, line)):
                self._stale_lines.update(range(first, line))
            return
        self.edits.append(Edit(self.src.starts[first - 1], self.src.starts[line - 1], ""))

    def drop_ordering_notes(self, first: int, last: int) -> None:
        """``# multi-gpu training (should be after apex fp16 initialization)`` on the comment lines
        first..last: once apex's initialize is gone the parenthesis speaks of code that is not
        there; it goes, the rest of the comment stays (Hugging Face's example scripts and their
        many copies carry two of these)."""
        for no in range(first, last + 1):
            text = self.src.line_text(no)
            if "apex" not in text.lower() or not text.lstrip().startswith("#"):
                continue
            m = _ORDERING_NOTE.search(text)
            if m:
                at = self.src.starts[no - 1]
                self.edits.append(Edit(at + m.start(), at + m.end(), ""))

    def drop_stale_comment(self, stmt, words: Sequence[str]) -> None:
        """The comment at the end of ``stmt``'s last line goes when it speaks of what the rewrite
        removed (``# ... copies the gradients to the master weights``), and so do the comment lines
        right above it."""
        from ampfix.engine.noqa import comment_of
        from ampfix.engine.tidy import comments_above

        top = self.b.first_line(stmt)
        first = comments_above(self.src, top)
        if first is not None and any(w in self.src.line_text(n).lower() for n in range(first, top) for w in words):
            # ... and the comment lines right above it, when they do
            self.edits.append(Edit(self.src.starts[first - 1], self.src.starts[top - 1], ""))
        # ... and the commented-out code right below it (`# norm_b = ...amp.master_params(opt)...`,
        # `# print(norm_a, norm_b)`), when a line of it does: it could not be uncommented any more
        below, no = [], stmt.end_lineno + 1
        while no <= self.src.line_count and _commented_code(self.src.line_text(no)) is not None:
            below.append(no)
            no += 1
        if below and any(w in self.src.line_text(n).lower() for n in below for w in words):
            self._stale_lines.update(below)
        no = stmt.end_lineno
        line = self.src.line_text(no)
        comment = comment_of(line, False)
        if not comment or not any(w in comment.lower() for w in words):
            return
        i = line.rfind(comment)
        if i < 0 or not line[:i].strip():
            return
        j = len(line[:i].rstrip())
        start = self.src.starts[no - 1]
        self.edits.append(Edit(start + j, start + len(line), ""))

    def _apex_labels(self, edits: List[Edit]) -> List[Edit]:
        """The comment lines right above each line the migration writes on lose apex's name where
        it was only their label or a link (:func:`relabeled`): ``#  Apex`` above the GradScaler
        made where ``amp.initialize`` was goes; ``# apex: amp fp16 mixed-precision training``
        says ``# amp fp16 mixed-precision training``.  A line another edit touches stays."""
        src = self.src
        written = {src.position(e.start)[0] for e in edits if e.region or (e.text + e.before + e.after).strip()}
        deletions = [(e.start, e.end) for e in edits if not e.region and not (e.text + e.before + e.after)]

        def deleted(no: int) -> bool:  # the whole line goes (`delay_unscale = ...` above the scaled backward)
            a, b = src.starts[no - 1], src.line_end(no)
            return any(x <= a and b <= y for x, y in deletions)

        out: List[Edit] = []
        done: Set[int] = set()
        for line in sorted(written):
            no = line - 1
            while no >= 1 and deleted(no) and not src.line_text(no).lstrip().startswith("#"):
                no -= 1  # what goes between the comment and the written line
            first = no
            while first - 1 >= 1 and src.line_text(first - 1).lstrip().startswith("#"):
                first -= 1
            alone = first == no  # a comment of one line
            while no >= 1 and src.line_text(no).lstrip().startswith("#") and no not in done:
                done.add(no)
                new = relabeled(src.line_text(no))
                if new is None and alone and _REMOVED_API.search(src.line_text(no)):
                    # `# The apex docs recommend calling amp.initialize before load_state_dict.`
                    new = ""
                if new == "" and no - 1 >= 1 and src.line_text(no - 1).lstrip().startswith("#") and \
                        dangles(src.line_text(no - 1).strip().lstrip("#")):
                    # `# save amp state according to` above the link that goes: what it points at is gone
                    new_above = ""
                else:
                    new_above = None
                for k, text in ((no, new), (no - 1, new_above)):
                    a, b = src.starts[k - 1], src.line_end(k)
                    if text is not None and not touched(a, b, [*kept_apart(a, b, edits), *out]):
                        out.append(Edit(a, b, "") if text == "" else Edit(a, a + len(src.line_text(k)), text))
                if new_above is not None:
                    done.add(no - 1)
                no -= 1
        return out

    def drop_commented_code(self, first: int, last: int, name: str, alone: bool = False) -> None:
        """Full comment lines between lines ``first`` and ``last`` that are commented-out code
        reading ``name`` (``# print(keep_batchnorm_fp32)``), once the migration removed the only
        binding of ``name``: the line could no longer be uncommented.  ``alone``: only a line
        with no comment line right above or below it (a line of a commented-out block would leave
        the block broken)."""
        word = re.compile(rf"\b{re.escape(name)}\b")
        comment = lambda k: 1 <= k <= self.src.line_count and self.src.line_text(k).strip().startswith("#")
        for no in range(first, last + 1):
            text = self.src.line_text(no).strip()
            if not text.startswith("#") or not word.search(text):
                continue
            if alone and (comment(no - 1) or comment(no + 1)):
                continue
            tree = _commented_code(text)
            if tree is not None and any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(tree)):
                self._stale_lines.add(no)

    def wrap(self, first, last, header: str) -> None:
        self.edits.append(self._safe(lambda: self.b.wrap(first, last, header)))

    def unwrap(self, compound, body) -> None:
        self.edits.append(self._safe(lambda: self.b.unwrap(compound, body)))

    def _safe(self, make):
        try:
            return make()
        except Conflict as exc:
            raise Refuse(str(exc)) from None

    def _above_comments(self, at: int, gone: Sequence[ast.stmt], edits: Sequence[Edit]) -> int:
        """Where lines inserted before a statement go: above the comment lines right over it when
        the statement stays and they do not speak of mixed precision (``# the model must be on the
        GPU already`` describes the assignment under it, not the GradScaler made before it)."""
        from ampfix.engine.tidy import comments_above, speaks_of_mixed_precision

        stmt = self._before.get(at)
        if stmt is None:
            return at
        spans = [self.b.span(g) for g in gone]
        start, end = self.b.span(stmt)
        if any(a <= start and end <= b for a, b in spans):
            return at  # it goes: a comment above it describes what takes its place
        line = self.b.first_line(stmt)
        first = comments_above(self.src, line)
        if first is None:
            return at
        text = " ".join(self.src.line_text(n) for n in range(first, line))
        top = self.src.starts[first - 1]
        if speaks_of_mixed_precision(text) or touched(top, at, edits):
            return at
        return top

    def finish(self) -> List[Edit]:
        edits = list(self.edits)
        text = self.src.text
        inserts = []
        makes = set()  # ids of the inserts that only make something (`scaler = GradScaler(...)`)
        for (at, indent), lines in self._inserts.items():
            body = self.b.statements(lines, indent)
            if at == len(text) and text and not text.endswith(("\n", "\r")):
                body = self.b.nl + body
            inserts.append(Edit(at, at, body))
            if all(_assigns(line) for line in lines):
                makes.add(id(inserts[-1]))
        edits = inserts + edits
        if self.removed:
            try:
                filled = set()
                for st in self._filled:
                    owner, field, _ = block_of(st)
                    filled.add((id(owner), field))
                remover = Remover(self.src, self.module.sem, self.b)
                remover.tests_moved |= self.tests_moved
                removals = remover.remove(self.removed, filled, self.described, self.obsolete,
                                          {at for at, _ in self._inserts})
            except Conflict as exc:
                raise Refuse(str(exc)) from None
            # a rewrite inside a statement that goes whole (`if amp:` around an initialize that
            # went, its test rewritten too) goes with it
            spans = [self.b.span(st) for st in remover.gone.values()]
            edits = [e for e in edits if e.start == e.end or not any(a <= e.start and e.end <= b for a, b in spans)]
            points = sorted(at for at, _ in self._inserts)
            for r in removals:
                # a removal that also takes the blank lines above its statement stops where
                # something is inserted (the scaler made before a guard that goes)
                inside = [at for at in points if r.start < at < r.end and not r.text]
                if inside and not r.region:
                    cut = max(inside)
                    if not self.src.text[r.start:cut].strip():
                        r = Edit(cut, r.end, r.text)
                edits.append(r)
        gone = list(remover.gone.values()) if self.removed else []
        for k, e in enumerate(edits):
            if id(e) not in makes:
                continue  # (`scaler.unscale_(opt)` before a clip stays under the comment on clipping)
            top = self._above_comments(e.start, gone, edits)
            if top != e.start:
                edits[k] = Edit(top, top, e.text)
        # stale commented-out code goes, unless another edit covers its line already
        for no in sorted(self._stale_lines):
            a, b = self.src.starts[no - 1], self.src.line_end(no)
            if not touched(a, b, edits):
                edits.append(Edit(a, b, ""))
        edits.extend(self._apex_labels(edits))
        # what the migration writes follows the module's own quotes (the module is tokenized only
        # when something written has a double quote)
        if any('"' in e.text + e.before + e.after for e in edits) and house_quote(self.src.text) == "'":
            edits = [replace(e, text=requote(e.text, "'"), before=requote(e.before, "'"),
                             after=requote(e.after, "'")) for e in edits]
        return edits


#: apex's API the migration removes, named in a comment (which then speaks of what is gone)
_REMOVED_API = re.compile(r"\bamp\.(initialize|scale_loss|master_params)\b|\bFP16_Optimizer\b|"
                          r"\bdelay_(unscale|allreduce)\b|\bapex\.parallel\b")
#: a link to apex (its repository, its docs), with the space before it and brackets around it
_APEX_LINK = re.compile(r"\s*[(<]?https?://\S*apex\S*?[)>.]?(?=\s|$)", re.IGNORECASE)
#: apex named at the start of a comment as its label (``# apex: fp16 training``, ``#  Apex``)
_APEX_LEAD = re.compile(r"^(?P<hash>\s*#+\s*)(?:nvidia(?:'s)?\s+)?apex\b\s*(?:[:\-]\s*)?", re.IGNORECASE)


def relabeled(line: str) -> Optional[str]:
    """A comment line above code the migration wrote, without apex's name where apex was only
    its label or a link (``# apex: amp fp16 training`` -> ``# amp fp16 training``, ``# Mixed
    precision training https://github.com/NVIDIA/apex`` -> ``# Mixed precision training``);
    "" when nothing is left (``#  Apex``); None when the comment stays as it is (apex is part
    of what it says: ``# add apex for loss.backward()``, or it does not name apex)."""
    if not line.lstrip().startswith("#") or not re.search(r"apex", line, re.IGNORECASE):
        return None
    new = _APEX_LINK.sub("", line)
    new = _APEX_LEAD.sub(lambda m: m.group("hash"), new)
    body = new.strip().lstrip("#").strip()
    if new == line or re.search(r"apex", body, re.IGNORECASE):
        return None
    if not re.search(r"\w", body) or dangles(body):
        return ""
    return new.rstrip()


#: last words of a comment that point at something that must follow (a link that went)
_DANGLING = {"see", "at", "from", "in", "to", "refer", "ref", "cf", "per", "via", "here", "by", "of", "on",
             "according", "following", "link", "docs", "url"}


def dangles(text: str) -> bool:
    """A comment that ends pointing at what followed it (``see``, ``according to``, ``:``)."""
    t = text.rstrip()
    if t.endswith(":"):
        return True
    words = re.findall(r"[A-Za-z]+", t.lower())
    return bool(words) and words[-1] in _DANGLING


def _commented_code(line: str) -> Optional[ast.Module]:
    """The statements of a line that is only a comment holding Python code (``# print(norm)``);
    None for prose (``# clip the gradients`` does not parse) and for code lines."""
    text = line.strip()
    if not text.startswith("#"):
        return None
    code = text.lstrip("#").strip()
    if not code or not (any(c in code for c in "()=[].") or code.startswith(("assert ", "del ", "raise "))):
        return None
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return None
    return tree if tree.body else None


def _assigns(line: str) -> bool:
    """A line of code that only binds a name or attribute (``self.scaler = GradScaler(...)``)."""
    try:
        body = ast.parse(line).body
    except SyntaxError:
        return False
    return len(body) == 1 and isinstance(body[0], (ast.Assign, ast.AnnAssign))


def kept_apart(a: int, b: int, edits: Sequence[Edit]) -> List[Edit]:
    """``edits`` less the regions that keep ``[a, b)`` whole inside (an ``if`` unwrapped around a
    comment line: the line moves out with its block, and may still be edited there)."""
    return [e for e in edits if not (e.region and e.inner and e.inner[0] <= a and b <= e.inner[1])]


def touched(a: int, b: int, edits: Sequence[Edit]) -> bool:
    """Some edit changes text in ``[a, b)`` (or inserts inside it)."""
    return any(e.start < b and a < e.end or (e.start == e.end and a < e.start < b) for e in edits)


def add_module_helper(fc: "FileChanges", module, text: str, key: str) -> None:
    """A helper function the migration needs, once per module, after its top imports (before
    any use at module level)."""
    if key in fc.helpers:
        return
    fc.helpers.add(key)
    body = module.tree.body
    i = 1 if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else 0
    last = None
    # after the last import of the module's head, past simple statements between imports
    # (`sys.path.insert(0, ".")`, `logger = ...`), before the first definition or block
    j = i
    while j < len(body) and not isinstance(body[j], (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        if isinstance(body[j], (ast.Import, ast.ImportFrom)) or _only_imports(body[j]):
            last, i = body[j], j + 1
        elif not isinstance(body[j], (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign)):
            break
        j += 1
    lines = text.rstrip("\n").split("\n")
    slot = fc.helper_slot
    if slot is not None:
        # a second helper of the module: after the first, two blank lines between them
        inserted, pad = slot
        inserted[len(inserted) - pad:len(inserted) - pad] = ["", "", *lines]
        return
    if last is not None:
        src = module.src
        no, blanks = last.end_lineno + 1, 0
        while no <= src.line_count and not src.line_text(no).strip():
            blanks, no = blanks + 1, no + 1
        pad = ["", ""][:max(0, 2 - blanks)] if no <= src.line_count else []
        fc.insert_after(last, ["", "", *lines, *pad], indent="")
        at = src.line_end(last.end_lineno)
        fc.helper_slot = (fc._inserts[(at, "")], len(pad))
    elif i < len(body):
        fc.insert_before(body[i], [*lines, "", ""])
        at = module.src.starts[fc.b.first_line(body[i]) - 1]
        fc.helper_slot = (fc._inserts[(at, fc.b.indent(body[i]))], 2)
    else:
        raise Refuse("the module has no statement to put a helper before")


def _only_imports(node) -> bool:
    from ampfix.model.semantic import iter_statements

    if not isinstance(node, (ast.Try, ast.If)):
        return False
    inner = list(iter_statements([node]))[1:]
    return any(isinstance(x, (ast.Import, ast.ImportFrom)) for x in inner) and all(
        isinstance(x, (ast.Import, ast.ImportFrom, ast.Pass, ast.Raise, ast.Assign, ast.Expr)) for x in inner)


class Group:
    """What changes together; ``uses`` are the apex nodes (per path) its fix resolves."""

    def __init__(self, gid: str, kind: str) -> None:
        self.id = gid
        self.kind = kind
        self.changes: Dict[str, FileChanges] = {}
        self.uses: Dict[str, List[ast.AST]] = {}
        self.notes: Set[str] = set()
        self.description = ""
        self.refusal: Optional[str] = None
        self.first_use: Optional[Tuple[str, ast.AST]] = None
        #: nodes of files the group edits without an apex use there (a call that now passes the
        #: scaler), with what to say about them
        self.anchors: Dict[str, List[Tuple[ast.AST, str]]] = {}
        self.note_at_anchor: Optional[str] = None  # said with the anchor use when rewritten
        #: why the rewrite changes behaviour, when it does: the group's fix is then unsafe
        #: (applied with --unsafe-fixes only), and the reason is in its description
        self.unsafe: Optional[str] = None
        #: the module whose other groups this one acts with (apex's op lists beside its
        #: amp.initialize): refused or unsafe with them (migration.planner._follow)
        self.follows: Optional[str] = None

    def file(self, module) -> FileChanges:
        fc = self.changes.get(module.path)
        if fc is None:
            if not module.editable:
                raise Refuse(f"{module.path} takes part but was not among the files given: run ampfix on the "
                             f"whole project")
            fc = self.changes[module.path] = FileChanges(module)
        return fc

    def add_use(self, path: str, node) -> None:
        self.uses.setdefault(path, []).append(node)
        if self.first_use is None:
            self.first_use = (path, node)

    @property
    def paths(self) -> List[str]:
        return sorted(set(self.uses) | set(self.changes) | set(self.anchors))
