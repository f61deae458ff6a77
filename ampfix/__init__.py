"""ampfix: find and fix mixed-precision mistakes in PyTorch training code."""

from ampfix.version import __version__  # noqa: F401  (ampfix.__version__)

#: the Python API (ampfix/api.py), imported on first use so that `import ampfix` stays light
_API = ("check", "check_code", "fix_code", "migrate")


def __getattr__(name):
    if name in _API:
        from ampfix import api

        return getattr(api, name)
    raise AttributeError(f"module 'ampfix' has no attribute {name!r}")


def _rules_from_a_checkout() -> None:
    """Installed, ``ampfix.rules`` is the package built from ``rules/``.  Run from a source
    checkout (``PYTHONPATH=.``, no install), the same folder is found beside this package."""
    import importlib.util
    import os
    import sys

    if "ampfix.rules" in sys.modules or importlib.util.find_spec("ampfix.rules") is not None:
        return
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rules")
    init = os.path.join(folder, "__init__.py")
    if os.path.isfile(init):
        spec = importlib.util.spec_from_file_location("ampfix.rules", init, submodule_search_locations=[folder])
        module = importlib.util.module_from_spec(spec)
        sys.modules["ampfix.rules"] = module
        spec.loader.exec_module(module)


try:
    _rules_from_a_checkout()
except Exception:  # never break the import of the package itself
    pass
