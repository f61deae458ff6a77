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
        Invalid("RUN git clone https://github.com/NVIDIA/apex && cd apex && pip install -v .\n",
                filename="Dockerfile", message="Dockerfile", project={"train.py": "import torch\n"}),
    ]

    def check_file(self, path, text, facts):
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        docker = "ockerfile" in name
        readme = name.upper().startswith("README")
        state = facts.cached("apex-imports", lambda: _apex_imports(facts.python))
        for no, line in enumerate(text.splitlines(), start=1):
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
    def _entry(name: str, line: str):
        """None: the line does not name apex; True: it is an apex entry alone on its line (it can
        go); False: apex is named inside a longer line (a person edits it)."""
        code = line.split("#", 1)[0] if not name.endswith(".py") else line
        if name.endswith((".txt", ".in")):
            return True if _REQ.match(code) else None
        if not (re.search(r"""["'\s-]apex\b(?![.\w-])""", " " + code, re.I) or _GIT.search(code)):
            return None
        if name.endswith(".py"):
            # a string "apex..." in setup.py: an entry if alone on its line
            if not re.search(r"""["']\s*(?:apex\b(?![.\w-])|git\+\S*NVIDIA/apex)""", code, re.I):
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
