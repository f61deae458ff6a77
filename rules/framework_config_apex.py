import re

from ampfix.rule import FileFinding, FileRule, Invalid, Valid

#: `key: value` on a YAML line (the value may be quoted), with what follows it
_YAML = re.compile(r"""^(?P<indent>\s*)(?:-\s+)?(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*:\s*(?P<q>["']?)(?P<value>[^"'#\s]*)(?P=q)"""
                   r"""(?P<rest>\s*(?:#.*)?)$""")
_JSON = re.compile(r'''"(?P<key>[A-Za-z_][A-Za-z0-9_]*)"\s*:\s*"?(?P<value>[^",}\s]*)"?''')
BACKENDS = ("amp_backend", "fp16_backend", "half_precision_backend")
LEVELS = ("amp_level", "fp16_opt_level")


class FrameworkConfigApex(FileRule):
    """
    ## What it does
    Finds apex chosen in the configuration files that feed a training framework: Lightning's
    `amp_backend: apex` / `amp_level: O2` (LightningCLI YAML) and Hugging Face's
    `fp16_backend: apex` / `half_precision_backend: apex` / `fp16_opt_level` (YAML or JSON
    training arguments).  In YAML the fix drops those keys and writes `precision: 16-mixed` for
    `precision: 16`, line by line, so comments and layout stay; JSON is named for a person.

    ## Why is this bad?
    Lightning 2.0 removed apex (its Trainer no longer takes `amp_backend` or `amp_level`: the
    run stops at start-up), and NVIDIA removed `apex.amp`, which Hugging Face's apex backend
    calls, in May 2025.  Native AMP is what both frameworks use without those keys.

    ## Example
    ```yaml
    trainer:
      precision: 16
      amp_backend: apex   # faster on V100
      amp_level: O2
    ```

    ## Use instead
    ```yaml
    trainer:
      precision: 16-mixed
    ```
    """

    code = "AMP111"
    name = "framework-apex-config"
    summary = "apex chosen in a Lightning or Hugging Face configuration file (amp_backend/fp16_backend: apex, amp_level)"
    fix_kind = "safe"
    since = "1.6"
    triggers = ("apex", "amp_level", "fp16_opt_level")
    files = ("*.yaml", "*.yml", "*.json")

    VALID = [
        Valid("trainer:\n  precision: 16-mixed\n", filename="config.yaml"),
        Valid("trainer:\n  amp_backend: native\n", filename="config.yaml"),
        Valid('{"fp16": true, "fp16_opt_level": "O1"}\n', filename="args.json"),
    ]
    INVALID = [
        Invalid("trainer:\n  precision: 16  # half\n  amp_backend: apex   # faster\n  amp_level: O2\n",
                filename="config.yaml", count=3, project={"train.py": "import torch\n"},
                expected="trainer:\n  precision: 16-mixed  # half\n"),
        Invalid('fp16: true\nfp16_backend: "apex"\nfp16_opt_level: O2\n', filename="args.yml", count=2,
                project={"train.py": "import torch\n"}, expected="fp16: true\n"),
        Invalid('{\n  "fp16": true,\n  "half_precision_backend": "apex",\n  "fp16_opt_level": "O2"\n}\n',
                filename="args.json", count=2, message="by hand", project={"train.py": "import torch\n"}),
    ]

    def check_file(self, path, text, facts):
        lines = text.splitlines(keepends=True)
        if path.endswith(".json"):
            yield from self._json(lines)
            return
        found = [(no, m) for no, line in enumerate(lines, start=1)
                 for m in [_YAML.match(line.rstrip("\r\n"))] if m]
        apex = any(m.group("key") in BACKENDS and m.group("value").lower() == "apex" for _, m in found)
        lightning = any(m.group("key") == "amp_backend" and m.group("value").lower() == "apex" for _, m in found)
        for no, m in found:
            key, value, col = m.group("key"), m.group("value"), len(m.group("indent")) + 1
            end = lines[no - 1][len(lines[no - 1].rstrip("\r\n")):]
            if key in BACKENDS and value.lower() == "apex":
                yield FileFinding(no, col, f"`{key}: apex` picks NVIDIA apex, which "
                                  + ("Lightning 2.0 removed" if key == "amp_backend" else "Hugging Face's Trainer can no "
                                     "longer use (apex.amp is gone)") + "; native AMP needs no backend key",
                                  True, f"the `{key}` line goes")
            elif key == "amp_level" or (key in LEVELS and apex):
                yield FileFinding(no, col, f"`{key}` is an apex opt level: nothing reads it with native AMP"
                                  + (" (Lightning 2.0 refuses it)" if key == "amp_level" else ""),
                                  True, f"the `{key}` line goes")
            elif key == "precision" and lightning and value in ("16", "'16'"):
                new = lines[no - 1][:m.start("q")] + "16-mixed" + m.group("rest") + end
                yield FileFinding(no, col, "`precision: 16` with the apex backend: Lightning 2 spells native AMP "
                                  "`16-mixed`", False, "precision: 16 -> 16-mixed", replacement=new)

    @staticmethod
    def _json(lines):
        text = "".join(lines)
        apex = any(m.group("key") in BACKENDS and m.group("value").lower() == "apex" for m in _JSON.finditer(text))
        for no, line in enumerate(lines, start=1):
            for m in _JSON.finditer(line):
                key, value = m.group("key"), m.group("value")
                if (key in BACKENDS and value.lower() == "apex") or (key in LEVELS and apex):
                    yield FileFinding(no, m.start() + 1, f"`{key}: {value}` picks NVIDIA apex, which the framework can no "
                                      "longer use; remove it by hand (JSON has no room for ampfix to keep your "
                                      "layout and commas right)")

    def well_formed(self, path, text):
        try:
            import yaml
        except ImportError:  # no YAML parser here: whole lines of `key: value` went, nothing else changed
            return True
        try:
            yaml.safe_load(text)
        except yaml.YAMLError:
            return False
        return True
