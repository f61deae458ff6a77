import ast
import re

from ampfix.rule import FileFinding, FileRule, Invalid, Valid

_GIT = re.compile(r"github\.com[/:]NVIDIA/apex", re.I)
#: a requirement entry that is apex: `apex`, `apex==0.1`, `apex @ git+...`, `git+...NVIDIA/apex`
_REQ = re.compile(r"""^\s*(?:-\s+)?(?:-e\s+)?["']?(?:apex\b(?![.\w-])|git\+\S*github\.com[/:]NVIDIA/apex)""", re.I)
_BARE = re.compile(r"""^\s*(?:-\s+)?["']?apex\s*(?:[=<>~!]=?\s*[\w.*]+\s*)?["']?,?\s*(?:#.*)?$""", re.I)
#: a line of a build that fetches or installs apex (Dockerfile, README)
_BUILD = re.compile(r"(?:github\.com[/:]NVIDIA/apex|(?:pip|pip3|conda)\s+install\b[^#\n]*\bapex\b|\bcd\s+apex\b)", re.I)
#: an entry alone on its line in a list (pyproject, setup.py, setup.cfg, environment.yml)
_ALONE = re.compile(r"""^\s*(?:-\s+)?(?:["'][^"']*["']|[^\s"',#]+)\s*,?\s*(?:#.*)?$""")
_POETRY = re.compile(r"""^\s*["']?apex["']?\s*=""", re.I)
#: a PEP 508 requirement: its name, then extras, a version, a marker or a URL
_REQUIREMENT = re.compile(r"""^\s*([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[[^\]]*\])?\s*(?:$|[<>=!~;@(])""")


def _is_apex_requirement(req: str) -> bool:
    """Whether a requirement string (PEP 508, or a bare git URL) names apex."""
    if _GIT.search(req) and req.strip().lower().startswith(("git+", "https://", "http://", "apex")):
        return True
    m = _REQUIREMENT.match(req)
    return bool(m) and m.group(1).lower().replace("_", "-") == "apex"


def _pyproject_apex(text: str):
    """The apex entries of a pyproject.toml read as data: {the requirement strings of
    [project] dependencies, optional-dependencies, dependency-groups and build-system requires
    that name apex}, and whether Poetry's dependency tables have an `apex` key.  None when the
    file is not valid TOML (nothing is reported from a file that cannot be read as data)."""
    try:
        import tomllib
    except ImportError:  # pragma: no cover - Python < 3.11
        import tomli as tomllib
    try:
        doc = tomllib.loads(text)
    except Exception:
        return None
    reqs = []
    project = doc.get("project") if isinstance(doc.get("project"), dict) else {}
    reqs += project.get("dependencies") or []
    for group in (project.get("optional-dependencies") or {}).values():
        reqs += group if isinstance(group, list) else []
    for group in (doc.get("dependency-groups") or {}).values():
        reqs += group if isinstance(group, list) else []
    build = doc.get("build-system") if isinstance(doc.get("build-system"), dict) else {}
    reqs += build.get("requires") or []
    poetry = ((doc.get("tool") or {}).get("poetry") or {}) if isinstance(doc.get("tool"), dict) else {}
    tables = [poetry.get("dependencies") or {}, poetry.get("dev-dependencies") or {}]
    tables += [(g or {}).get("dependencies") or {} for g in (poetry.get("group") or {}).values() if isinstance(g, dict)]
    in_poetry = any(isinstance(tb, dict) and any(k.lower() == "apex" for k in tb) for tb in tables)
    return {r for r in reqs if isinstance(r, str) and _is_apex_requirement(r)}, in_poetry


def _quoted(line: str):
    return [a or b for a, b in re.findall(r'"([^"\\]*)"|\'([^\']*)\'', line)]


class ApexDependency(FileRule):
    """
    ## What it does
    Finds NVIDIA apex in the files around the code: `requirements*.txt`, `pyproject.toml`,
    `setup.py` / `setup.cfg`, conda `environment.yml`, Dockerfiles that clone and build apex, and
    README install steps.

    ## Why is this bad?
    NVIDIA removed `apex.amp` and apex's DDP from apex itself in May 2025 (NVIDIA/apex#1896): a
    fresh build of apex no longer has the API the code calls, so the environment either pins an
    apex commit from before it or breaks.  Building apex is often the slowest step of an image.
    And `apex` on the public package index is an unrelated project: a `requirements.txt` that says
    `apex` never installed NVIDIA's.

    Once `ampfix migrate --write` has removed the project's last apex import, it removes the
    entries of requirements and project metadata files too; Dockerfile and README lines are named
    for a person (ampfix does not edit them).

    ## Example
    ```text
    # requirements.txt
    torch>=1.13
    apex
    ```

    ## Use instead
    ```text
    # requirements.txt
    torch>=1.13
    ```
    with the code on native `torch.amp` (`ampfix migrate`).
    """

    code = "AMP107"
    name = "apex-dependency"
    summary = "NVIDIA apex named in requirements, project metadata, conda environments, Dockerfiles or READMEs"
    fix_kind = "safe"
    since = "1.6"
    triggers = ("apex",)
    files = ("requirements*.txt", "*requirements.txt", "requirements*.in", "pyproject.toml", "setup.py", "setup.cfg",
             "environment.yml", "environment.yaml", "environment*.yml", "Dockerfile", "Dockerfile.*", "*.Dockerfile",
             "dockerfile", "README", "README.md", "README.rst", "README.txt")

    VALID = [
        Valid("torch>=1.13\napex-utils==1.0\n", filename="requirements.txt"),
        Valid('[project]\nname = "x"\ndescription = "Helpers for migrating away from apex"\n'
              'keywords = ["apex", "amp"]\ndependencies = ["torch"]\n', filename="pyproject.toml"),
        Valid('from setuptools import setup\nsetup(name="x", description="replaces apex",\n'
              '      install_requires=["torch"])\n', filename="setup.py"),
        Valid("RUN pip install torch\n", filename="Dockerfile"),
    ]
    INVALID = [
        Invalid("torch>=1.13\napex\n", filename="requirements.txt", message="unrelated project",
                project={"train.py": "from apex import amp\nmodel, opt = amp.initialize(model, opt)\n"}),
        Invalid("torch>=1.13\napex\n", filename="requirements.txt", expected="torch>=1.13\n",
                project={"train.py": "import torch\nscaler = torch.amp.GradScaler('cuda')\n"}),
        Invalid('[project]\ndependencies = [\n  "torch",\n  "apex @ git+https://github.com/NVIDIA/apex",\n]\n',
                filename="pyproject.toml", message="May 2025",
                project={"train.py": "from apex import amp\n"}),
        Invalid('[tool.poetry.dependencies]\npython = "^3.9"\napex = {git = "https://github.com/NVIDIA/apex"}\n',
                filename="pyproject.toml", expected='[tool.poetry.dependencies]\npython = "^3.9"\n',
                project={"train.py": "import torch\n"}),
        Invalid('[project.optional-dependencies]\nfast = [\n  "apex>=0.1",\n]\n', filename="pyproject.toml",
                message="dependency", project={"train.py": "from apex import amp\n"}),
        Invalid("RUN git clone https://github.com/NVIDIA/apex && cd apex && pip install -v .\n",
                filename="Dockerfile", message="Dockerfile", project={"train.py": "import torch\n"}),
    ]

    def check_file(self, path, text, facts):
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        docker = "ockerfile" in name
        readme = name.upper().startswith("README")
        state = facts.cached("apex-imports", lambda: _apex_imports(facts.python))
        toml = _pyproject_apex(text) if name == "pyproject.toml" else None
        if name == "pyproject.toml" and toml is None:
            return  # not valid TOML: its dependencies cannot be read as data
        table = ""
        for no, line in enumerate(text.splitlines(), start=1):
            if toml is not None:
                header = re.match(r"^\s*\[\[?\s*([^\]]+?)\s*\]", line)
                if header:
                    table = header.group(1)
                    continue
                entry = self._toml_entry(line, table, *toml)
                if entry is None:
                    continue
                yield FileFinding(no, _col(line), "NVIDIA apex is a dependency here" + _state(state, facts, by_hand=not entry),
                                  entry and not state["imports"], "the apex entry goes (no file imports apex any more)")
                continue
            if docker or readme:
                if not _BUILD.search(line) and not (readme and _GIT.search(line)):
                    continue
                what = ("this Dockerfile builds NVIDIA apex from source (often the image's slowest step)" if docker
                        else "the README tells users to install NVIDIA apex")
                yield FileFinding(no, _col(line), what + _state(state, facts, by_hand=True))
                continue
            entry = self._entry(name, line)
            if entry is None:
                continue
            bare = name.endswith((".txt", ".in")) and _BARE.match(line) and not _GIT.search(line)
            what = ("`apex` on the package index is an unrelated project: `pip install apex` never installed NVIDIA "
                    "apex, which is built from github.com/NVIDIA/apex" if bare else "NVIDIA apex is a dependency here")
            removable = entry and not state["imports"]
            yield FileFinding(no, _col(line), what + _state(state, facts, by_hand=not entry), removable,
                              "the apex entry goes (no file imports apex any more)")

    @staticmethod
    def _toml_entry(line: str, table: str, reqs, in_poetry: bool):
        """Like :meth:`_entry`, for a line of a pyproject.toml whose apex requirements were read as
        data: a line holding one of them as a string (alone: removable), or Poetry's `apex = ...`."""
        code = line.split("#", 1)[0]
        if in_poetry and table.startswith("tool.poetry") and table.endswith("dependencies") and _POETRY.match(code):
            return True
        strings = _quoted(code)
        if not any(s in reqs for s in strings):
            return None
        return len(strings) == 1 and bool(_ALONE.match(code))

    @staticmethod
    def _entry(name: str, line: str):
        """None: the line does not name apex; True: it is an apex entry alone on its line (it can
        go); False: apex is named inside a longer line (a person edits it)."""
        code = line.split("#", 1)[0] if not name.endswith(".py") else line
        if name.endswith((".txt", ".in")):
            return True if _REQ.match(code) else None
        if not (re.search(r"""["'\s-]apex\b(?![.\w-])""", " " + code, re.I) or _GIT.search(code)):
            return None
        if name.endswith(".py"):
            # a requirement string "apex..." in setup.py: an entry if alone on its line
            if not any(_is_apex_requirement(s) for s in _quoted(code)):
                return None
            return bool(_ALONE.match(line))
        if name == "pyproject.toml" and _POETRY.match(code):
            return True
        return bool(_ALONE.match(code) and (_REQ.match(code.strip().strip("\"',")) or _GIT.search(code)))

    def well_formed(self, path, text):
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        if name == "pyproject.toml":
            try:
                import tomllib
            except ImportError:  # pragma: no cover - Python < 3.11
                import tomli as tomllib
            try:
                tomllib.loads(text)
            except Exception:
                return False
        elif name.endswith(".py"):
            try:
                ast.parse(text)
            except SyntaxError:
                return False
        elif name.endswith(".cfg"):
            import configparser

            try:
                configparser.ConfigParser(interpolation=None).read_string(text)
            except configparser.Error:
                return False
        return True


def _col(line: str) -> int:
    return 1 + len(line) - len(line.lstrip())


def _apex_imports(python):
    """Which files import apex at all, and which use what apex removed (amp, its DDP)."""
    imports, removed = [], []
    for path, text in sorted(python.items()):
        if "apex" not in text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        mods = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                mods |= {a.name for a in n.names if a.name.split(".")[0] == "apex"}
            elif isinstance(n, ast.ImportFrom) and n.module and n.module.split(".")[0] == "apex" and not n.level:
                mods |= {f"{n.module}.{a.name}" for a in n.names}
        if not mods:
            continue
        imports.append(path)
        if any(m.startswith(("apex.amp", "apex.parallel.DistributedDataParallel", "apex.RNN")) for m in mods) or (
                "apex" in mods and re.search(r"\bapex\.amp\b", text)):
            removed.append(path)
    return {"imports": imports, "removed": removed}


def _state(state, facts, by_hand: bool) -> str:
    def some(paths):
        more = f" and {len(paths) - 1} more" if len(paths) > 1 else ""
        return f"{paths[0]}{more}"

    if state["removed"]:
        return ("; apex removed amp and its DDP in May 2025 (NVIDIA/apex#1896): migrate the code to torch.amp "
                f"(`ampfix migrate`: {some(state['removed'])}) or pin an apex commit from before it")
    if state["imports"]:
        return f"; still imported by {some(state['imports'])}"
    if not facts.whole:
        return "; ampfix was not given the whole project, so it cannot tell whether apex is still needed"
    if by_hand:
        return "; no file imports apex any more: remove it by hand"
    return "; no file imports apex any more: remove it (`ampfix migrate --write` does)"
