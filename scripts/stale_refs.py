"""List the module, name and file references in the docs and the services' text that resolve
to nothing: a ``preft_serve.x.y`` dotted name, or a path such as ``registry/models.py``.

Docs and docstrings outlive the code they name; a rename that misses one leaves a reader
looking for a module that is gone. Usage: ``python scripts/stale_refs.py`` (exit status 1
when something is stale; each line is ``file:line: reference``).

Read statically (no imports): a dotted name resolves when its longest module prefix is a
file or package under ``services/`` or ``kernels/`` and what follows is a name defined at
the top level of that module (or, one level further, inside a class of it). A path resolves
when it exists from the repository root, from ``services/preft_serve``, from the folder of
the file naming it, or under any folder of the tree with that last folder name.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_ROOTS = (ROOT / "services", ROOT / "kernels")
DOTTED = re.compile(r"(?<![\w./-])((?:preft_serve|preft_kernels)(?:\.[A-Za-z_]\w*)+)")
PATH = re.compile(r"(?<![\w./:@-])((?:[\w-]+/)+[\w-]+\.(?:py|md|yaml|yml|toml|sh|json|tpl))\b")
# Paths the scan does not judge: benchmark folders being moved, and generated or external
# files (site-packages, vLLM's sources) quoted for reference.
SKIPPED = (
    "bench/",
    "vllm/",
    "site-packages",
    "transformers/",
    "peft/",
    "templates/",
    ".github/",
    "backend/",
    "src/",
    "lorax",
    "kubernetes/",
    "v1/request.py",  # vLLM's
    "var/",  # generated results and reports
    "XDG_CONFIG_HOME/",
    "families/mytype.py",
)  # a user's file, an example to write
# Logger names that look like modules.
LOGGERS = ("preft_serve.registry.access", "preft_serve.gateway.access")
# A short dotted name in backticks (``registry_client.contract``, ``finetune.spec.x``) whose
# first part is a package of preft_serve, in the services' sources (the docs' dotted names
# are mostly Helm values).
SHORT = re.compile(r"`+([a-z_][a-z0-9_]*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`+")


def sources() -> Iterator[Path]:
    yield from sorted((ROOT / "services").rglob("*.py"))
    yield from sorted((ROOT / "docs").rglob("*.md"))
    yield ROOT / "README.md"
    yield ROOT / "CONTRIBUTING.md"


def module_file(parts: list[str]) -> Path | None:
    for root in PACKAGE_ROOTS:
        base = root.joinpath(*parts)
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


@functools.cache
def top_level_names(path: Path) -> dict[str, set[str]]:
    """Each top-level name of a module, with the names a class defines (else empty)."""
    names: dict[str, set[str]] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef):
            names[node.name] = {
                t.id if isinstance(t, ast.Name) else getattr(t, "name", "")
                for item in node.body
                for t in ([item] if not isinstance(item, ast.Assign) else item.targets)
                if isinstance(t, ast.Name | ast.FunctionDef | ast.AsyncFunctionDef)
            } | {
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = set()
        elif isinstance(node, ast.Assign):
            names.update({t.id: set() for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = set()
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update({(a.asname or a.name).split(".")[0]: set() for a in node.names})
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING and optional imports
            for sub in ast.walk(node):
                if isinstance(sub, ast.Import | ast.ImportFrom):
                    names.update({(a.asname or a.name).split(".")[0]: set() for a in sub.names})
    return names


def dotted_resolves(name: str) -> bool:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        path = module_file(parts[:cut])
        if path is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        defined = top_level_names(path)
        if rest[0] not in defined:
            return False
        return len(rest) == 1 or rest[1] in defined[rest[0]] or not defined[rest[0]]
    return False


@functools.cache
def folders_named(name: str) -> tuple[Path, ...]:
    return tuple(
        p
        for p in ROOT.rglob(name)
        if p.is_dir() and ".venv" not in p.parts and ".git" not in p.parts
    )


def short_anchor(first: str, source: Path) -> str | None:
    """The package a short dotted name starting with ``first`` is relative to: a package
    (folder) of preft_serve, the source's own or its parent's (a module-like first part is
    too often a variable: ``settings.discovery``)."""
    if first in sys.stdlib_module_names:
        return None
    package = ROOT / "services" / "preft_serve"
    places = [source.parent, source.parent.parent] if package in source.parents else []
    for folder in [*places, package]:
        if (folder / first / "__init__.py").is_file():
            return ".".join(folder.relative_to(ROOT / "services").parts)
    return None


def path_resolves(ref: str, source: Path) -> bool:
    bases = (ROOT, ROOT / "services" / "preft_serve", ROOT / "services", source.parent)
    if any((base / ref).exists() for base in bases):
        return True
    first, _, rest = ref.partition("/")
    return any((folder / rest).exists() for folder in folders_named(first))


def stale(source: Path) -> Iterator[tuple[int, str]]:
    for number, line in enumerate(source.read_text().splitlines(), 1):
        for match in DOTTED.finditer(line):
            name = match.group(1).rstrip(".")
            if name not in LOGGERS and not dotted_resolves(name):
                yield number, name
        for match in SHORT.finditer(line if source.suffix == ".py" else ""):
            name = match.group(1)
            anchor = short_anchor(name.split(".")[0], source)
            if re.search(r"[a-z][A-Z]", name):  # a Helm value (worker.maxLoraRank)
                continue
            if anchor is not None and not dotted_resolves(f"{anchor}.{name}"):
                yield number, name
        for match in PATH.finditer(line):
            ref = match.group(1)
            if not any(skip in ref for skip in SKIPPED) and not path_resolves(ref, source):
                yield number, ref


def main() -> int:
    found = 0
    for source in sources():
        for number, ref in stale(source):
            print(f"{source.relative_to(ROOT)}:{number}: {ref}")
            found += 1
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
