"""The package layout: imports run one way, and the producing side never loads the consumer."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "messenger"

#: Layer of each part of `messenger`; a module may import only its own layer or lower ones.
LAYERS = {
    "core": 0,
    "jobs": 1,
    "produce": 2,
    "consume": 2,
    "ops": 2,
    "spark": 3,
    "operations": 3,
    "api": 3,
    "tools": 4,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def part_of(module: str) -> str:
    """'messenger.consume.runtime' → 'consume'; core modules ('messenger.channel') → 'core'.

    Siblings of one layer (produce, consume, ops) never import each other."""
    pieces = module.split(".")
    if module == "messenger.__main__":  # `python -m messenger` is the command
        return "tools"
    if len(pieces) == 1:
        return "core"
    if pieces[1] in LAYERS:
        return pieces[1]
    return "core"


def imports_of(path: Path) -> set[str]:
    """Every messenger module `path` imports, typing-only imports included."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("messenger"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "messenger":
                found.update(f"messenger.{a.name}" for a in node.names)
            elif node.module.startswith("messenger."):
                found.add(node.module)
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges[name] = {t for t in imports_of(path) if t in modules} - {name}
    return edges


def test_imports_point_down_the_layers():
    wrong = []
    for source, targets in graph().items():
        if source == "messenger":  # the facade re-exports the public API (lazily)
            continue
        for target in targets:
            a, b = part_of(source), part_of(target)
            if a == b:
                continue
            if LAYERS[b] >= LAYERS[a]:
                wrong.append(f"{source} ({a}) imports {target} ({b})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_cycles_between_modules():
    edges = graph()
    edges.pop("messenger", None)
    for targets in edges.values():
        targets.discard("messenger")
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(trail[trail.index(nxt):] + [nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(" → ".join(c) for c in cycles)


def test_the_library_imports_no_deployment_code():
    forbidden = ("aws_cdk", "constructs", "cdk_nag", "stacks", "lambdas", "spark_jobs", "examples")
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            wrong += [f"{path.relative_to(ROOT)}: {n}" for n in names
                      if n.split(".")[0] in forbidden]
    assert not wrong, wrong


def test_stacks_take_the_schedule_model_from_the_core():
    # The CDK app validates and builds recurring schedules with `messenger.schedule_spec`, a
    # core module beside `messenger.channel`: never with the job-queue runtime (messenger.jobs),
    # the producers or the consumers.
    wrong = []
    for path in (ROOT / "stacks").rglob("*.py"):
        wrong += [f"{path.relative_to(ROOT)}: {name}" for name in imports_of(path)
                  if name.split(".")[:2] in (["messenger", "jobs"], ["messenger", "produce"])]
    assert not wrong, wrong


def test_stacks_never_import_the_examples():
    wrong = []
    for path in (ROOT / "stacks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("examples"):
                wrong.append(str(path.relative_to(ROOT)))
            if isinstance(node, ast.Import) and any(
                a.name.startswith("examples") for a in node.names
            ):
                wrong.append(str(path.relative_to(ROOT)))
    assert not wrong, wrong


#: The `messenger` commands' own modules: views, which nothing else imports from.
COMMAND_MODULES = {"messenger.tools.cli", "messenger.tools.top", "messenger.tools.dlq",
                   "messenger.tools.workers", "messenger.tools.requeue"}


def test_the_commands_and_the_dashboard_are_views_over_public_names():
    # Given every import of the tools (the `messenger` commands and the dashboard)
    wrong = []
    for path in (PACKAGE / "tools").rglob("*.py"):
        source = module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                    and node.module.startswith("messenger.") and node.module != source):
                continue
            # Then none names another module's private helper (`_age`, `_serves`), and the
            # dashboard takes nothing from a command's module: both call the library
            wrong += [f"{source}: from {node.module} import {alias.name}"
                      for alias in node.names if alias.name.startswith("_")]
            if source.startswith("messenger.tools.dashboard") and node.module in COMMAND_MODULES:
                wrong.append(f"{source}: from {node.module} import ...")
    assert wrong == []


def _modules_after(code: str) -> list[str]:
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_the_producing_side_loads_nothing_of_the_consumer_runtime():
    # Given a fresh interpreter, as on a Spark executor or in a Lambda
    loaded = _modules_after(
        "from messenger import Producer, MultiProducer, PushItem, Settings\n"
        "import messenger.produce.producer, messenger.spark, messenger.jobs.status"
    )
    # Then neither the consumer runtime nor its dependencies nor the tools were imported
    unwanted = [
        m for m in loaded
        if m.startswith(("messenger.consume", "messenger.tools", "messenger.ops", "filelock"))
    ]
    assert unwanted == []
    assert "messenger.produce.producer" in loaded


def test_the_public_api_is_importable_from_the_package():
    loaded = _modules_after(
        "import messenger\n"
        "missing = [n for n in messenger.__all__ if getattr(messenger, n, None) is None]\n"
        "assert not missing, missing"
    )
    assert "messenger.consume.consumer" in loaded


#: Libraries whose private code messenger must not reach (docs/fast-botocore.md: the shortcuts
#: that did were removed). Top-level package names.
NOT_REACHED_INTO = ("boto3", "botocore", "s3transfer", "urllib3", "http", "email")


def _private_botocore_attributes() -> set[str]:
    """The private attribute names of a botocore client and the objects it holds (endpoint,
    HTTP session, signer, serializer, event emitter, user agent, config)."""
    import boto3

    client = boto3.session.Session(region_name="us-east-1").client("sqs")
    seen: set[str] = set()
    objects: list[object] = [client, client.meta, client.meta.events]
    names: set[str] = set()
    while objects:
        held = objects.pop()
        if id(held) in seen or not hasattr(held, "__dict__"):
            continue
        seen.add(id(held))
        for name, value in vars(held).items():
            if name.startswith("_") and not name.startswith("__"):
                names.add(name)
                if type(value).__module__.split(".")[0] in NOT_REACHED_INTO:
                    objects.append(value)
        for cls in type(held).__mro__:
            if cls.__module__.split(".")[0] in NOT_REACHED_INTO:
                names.update(n for n in vars(cls) if n.startswith("_") and not n.startswith("__"))
    return names


def test_the_library_reads_no_private_name_of_botocore_or_the_standard_library():
    # Given every private name of a botocore client and what it holds (read here, in a test),
    # but for names messenger's own classes define too (a `_lock` of its own is its own)
    trees = {path: ast.parse(path.read_text(), filename=str(path))
             for path in sorted(PACKAGE.rglob("*.py"))}
    own = {node.attr for tree in trees.values() for node in ast.walk(tree)
           if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
           and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")}
    own |= {node.name for tree in trees.values() for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    private = _private_botocore_attributes()
    assert {"_endpoint", "_request_signer", "_serializer", "_emitter"} <= private - own
    private -= own
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            # When the library imports a private module or name of botocore, boto3, urllib3,
            # http or email, or reads one of those attributes
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.split(".")[0] in NOT_REACHED_INTO:
                parts = node.module.split(".") + [alias.name for alias in node.names]
                found += [f"{path}: from {node.module} import {p}"
                          for p in parts if p.startswith("_")]
            elif isinstance(node, ast.Import):
                found += [f"{path}: import {alias.name}" for alias in node.names
                          if alias.name.split(".")[0] in NOT_REACHED_INTO
                          and any(p.startswith("_") for p in alias.name.split("."))]
            elif isinstance(node, ast.Attribute) and node.attr in private and not (
                    isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{path}:{node.lineno}: .{node.attr}")
    # Then it does none of that: it depends on their public interfaces only
    assert found == []


# -- public interfaces (issue 51) --------------------------------------------------------------
#: Our code: the library, the CDK app, the Lambda handlers, the Spark jobs and the examples.
OUR_PACKAGES = ("messenger", "stacks", "lambdas", "spark_jobs", "examples")
#: Libraries whose non-public modules and names we must not use (docs/architecture.md).
GUARDED_LIBRARIES = ("botocore", "boto3", "s3transfer", "urllib3", "aws_lambda_powertools")
#: Underscore names the standard library documents as public (os._exit; namedtuple's methods).
DOCUMENTED_UNDERSCORE_NAMES = frozenset({"_exit", "_replace", "_asdict", "_fields", "_make"})
#: Powertools modules without `__all__` whose names its documentation imports from them: the
#: OpenAPI parameters (event handler, "Validating ..."), its exceptions modules.
POWERTOOLS_DOCUMENTED_MODULES = ("aws_lambda_powertools.event_handler.openapi.params",
                                 "aws_lambda_powertools.event_handler.openapi.exceptions")

#: Today's violations, each to be removed by issue 51's remaining work (the outcome/runtime
#: split); the list may only shrink: a new violation fails the test. (file, what it uses)
ALLOWED_TODAY = {
    # issue 51: PySpark has no public API to Hadoop's FileSystem (the failed rows' path check).
    ("messenger/spark.py", "spark.sparkContext._jvm"),
    ("messenger/spark.py", "spark.sparkContext._jsc"),
}
#: The local endpoint's patches of moto (the emulator, not a production dependency; pinned):
#: these two modules are where its internals are known, to reproduce what AWS does that moto
#: does not (docs/local-development.md). Nothing else may reach into moto.
EMULATOR_PATCHES = {
    ("messenger/tools/moto_sqs.py", "queue._messages_lock"),
    ("messenger/tools/moto_sqs.py", "moto.sqs.models._filter_message_attributes"),
    ("messenger/tools/moto_sqs.py", "moto.moto_api._internal"),
    ("messenger/tools/moto_metrics.py", "queue._messages"),
}


def _our_sources() -> dict[Path, ast.Module]:
    paths = [p for top in OUR_PACKAGES for p in sorted((ROOT / top).rglob("*.py"))]
    paths.append(ROOT / "app.py")
    return {p: ast.parse(p.read_text(), filename=str(p)) for p in paths
            if "__pycache__" not in p.parts}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_in(tree: ast.Module) -> set[str]:
    """Every name a module binds itself: definitions, assignments (self._x = ...), arguments,
    keywords and imports."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return names


def private_uses(path: Path, tree: ast.Module) -> set[str]:
    """What a module uses of another module's (ours or a library's) non-public names:
    `from x import _y`, `import x._y`, and `x._y` where `_y` is not a name the module defines
    itself (its own class's `other._lock` is its own) nor a documented one; `self._y`,
    `cls._y` and `super()._y` are the class's own."""
    own = _defined_in(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if any(_private(part) for part in node.module.split(".")):
                found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names if _private(a.name)}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names
                      if any(_private(part) for part in a.name.split("."))}
        elif isinstance(node, ast.Attribute) and _private(node.attr) \
                and node.attr not in own and node.attr not in DOCUMENTED_UNDERSCORE_NAMES:
            held = node.value
            if isinstance(held, ast.Name) and held.id in ("self", "cls"):
                continue
            if isinstance(held, ast.Call) and isinstance(held.func, ast.Name) \
                    and held.func.id == "super":
                continue
            found.add(ast.unparse(node))
    return found


def _powertools_public(module: str, name: str) -> bool:
    """Whether Powertools offers `name` of `module` publicly: in the module's `__all__`, a
    submodule of a package (`logging.correlation_paths`), or from a module its documentation
    imports from (POWERTOOLS_DOCUMENTED_MODULES, an `exceptions` module)."""
    import importlib
    import importlib.util

    imported = importlib.import_module(module)
    if name in getattr(imported, "__all__", ()):
        return True
    if hasattr(imported, "__path__") and importlib.util.find_spec(f"{module}.{name}"):
        return True
    return module in POWERTOOLS_DOCUMENTED_MODULES or module.endswith(".exceptions")


def library_non_public(tree: ast.Module) -> set[str]:
    """Names a module imports from GUARDED_LIBRARIES that are not public: a private module or
    name (any library), or a Powertools name outside its public ones (`_powertools_public`)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] in GUARDED_LIBRARIES:
            for alias in node.names:
                if node.module.startswith("aws_lambda_powertools") and \
                        not _powertools_public(node.module, alias.name):
                    found.add(f"{node.module}.{alias.name}")
    return found


def test_no_module_uses_another_modules_private_name_nor_a_librarys_non_public_one():
    # Given every module of ours
    used = set()
    for path, tree in _our_sources().items():
        where = str(path.relative_to(ROOT))
        # When we list what it uses of other modules' non-public names
        used |= {(where, name) for name in private_uses(path, tree) | library_non_public(tree)}
    # Then nothing beyond the explicit lists: a new one fails here, and a fixed one must leave
    # the list (so that it only shrinks)
    assert sorted(used - ALLOWED_TODAY - EMULATOR_PATCHES) == []
    assert sorted((ALLOWED_TODAY | EMULATOR_PATCHES) - used) == []


def test_the_private_use_check_sees_each_way_of_reaching_in(tmp_path: Path):
    # Given a module that reaches into others in each way the check knows, and its own class
    source = (
        "from messenger.consume.consumer import _load\n"
        "import messenger.tools._secret\n"
        "from botocore._internal import thing\n"
        "from aws_lambda_powertools.utilities.idempotency.base import IdempotencyHandler\n"
        "from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig\n"
        "from aws_lambda_powertools.utilities.idempotency.exceptions import "
        "IdempotencyValidationError\n"
        "class Mine:\n"
        "    def __init__(self):\n"
        "        self._lock = None\n"
        "    def same(self, other):\n"
        "        return other._lock, self._lock, super()._x, os._exit\n"
        "def run(consumer, client):\n"
        "    return consumer._mailboxes(), client._endpoint\n"
    )
    path = tmp_path / "reach.py"
    tree = ast.parse(source)
    # Then each reach is found, and the class's own names and documented ones are not
    assert private_uses(path, tree) == {
        "messenger.consume.consumer._load", "messenger.tools._secret", "botocore._internal",
        "consumer._mailboxes", "client._endpoint",
    }
    assert library_non_public(tree) == {
        "aws_lambda_powertools.utilities.idempotency.base.IdempotencyHandler"}


def test_stacks_import_nothing_from_the_commands():
    # The CDK app takes its facts from core modules (e.g. messenger.emr_step), never from a
    # `messenger` command's module (messenger.tools), which may import anything it shows
    wrong = []
    for path in (ROOT / "stacks").rglob("*.py"):
        wrong += [f"{path.relative_to(ROOT)}: {name}" for name in imports_of(path)
                  if name == "messenger.tools" or name.startswith("messenger.tools.")]
    assert wrong == []


def test_the_dashboard_and_the_commands_import_only_public_names_of_operations_and_jobs():
    # Given every import of messenger.operations and messenger.jobs by the tools (the CLI and
    # the dashboard)
    import importlib

    wrong = []
    for path in (PACKAGE / "tools").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                    and node.module.split(".")[:2] in (["messenger", "operations"],
                                                       ["messenger", "jobs"])):
                continue
            public = getattr(importlib.import_module(node.module), "__all__", None)
            for alias in node.names:
                # Then each is public: no underscore, and in the module's __all__ if it has one
                if _private(alias.name) or (public is not None and alias.name not in public):
                    wrong.append(f"{path.relative_to(ROOT)}: {node.module}.{alias.name}")
        wrong += [f"{path.relative_to(ROOT)}: {name}" for name in private_uses(path, tree)
                  if name.startswith(("messenger.operations", "messenger.jobs"))]
    assert wrong == []
