"""Import consumer classes at synth the way their image will, to read what they declare.

Each folder's classes are imported in one fresh interpreter that sees only what the image holds:
the `messenger` library and the folder as its package. A team's code may need packages of its
own (its `requirements.txt`) that the CDK's environment lacks: when an import fails on a module
one of those requirements provides, that module is stood in by a placeholder and the class is
imported again, so every check that reads the class as written still runs; the facts then name
the modules that were absent (`"absent": [...]`) and the service says so in one warning line.
A module no requirement provides stays an error (a typo, or a requirement left out).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stacks.bundle import REPO_ROOT

#: Seconds the consumer classes of one folder may take to import at synth.
INSPECT_TIMEOUT = 120
#: Distributions whose import name is not their name (lower case, '-' as '_'); every other
#: requirement `name` provides the module `name`.
IMPORT_NAMES = {
    "pyyaml": "yaml", "python_dateutil": "dateutil", "beautifulsoup4": "bs4", "pillow": "PIL",
    "scikit_learn": "sklearn", "attrs": "attr", "opencv_python": "cv2", "protobuf": "google",
    "python_dotenv": "dotenv", "pyjwt": "jwt", "psycopg2_binary": "psycopg2",
}
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
#: Run in a fresh interpreter with only the image's code on the path, like the container:
#: imports each class the way `messenger consume` does and prints what the lint compares.
_INSPECT = """
import importlib, importlib.abc, importlib.machinery, json, os, sys, types
from messenger.consume.consumer import Consumer, load_consumer

provided = set(json.loads(os.environ["MESSENGER_CHECK_PROVIDED"]))
absent = set()


class Placeholder:
    '''Anything of a module absent here: attributes, calls and items are placeholders too; a
    decorator leaves what it decorates as it is; as a base class it drops out.'''

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attribute):
        if attribute.startswith('__'):
            raise AttributeError(attribute)
        return Placeholder(self._name + '.' + attribute)

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return Placeholder(self._name + '()')

    def __getitem__(self, key):
        return Placeholder(self._name + '[]')

    def __mro_entries__(self, bases):
        return ()

    def __repr__(self):
        return '<absent ' + self._name + '>'


class AbsentModule(types.ModuleType):
    def __getattr__(self, attribute):
        if attribute.startswith('__'):
            raise AttributeError(attribute)
        return Placeholder(self.__name__ + '.' + attribute)


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split('.')[0] in absent:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return AbsentModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []


sys.meta_path.append(StandIns())


def load(target):
    module = target.partition(':')[0]
    package = module.split('.')[0]
    while True:
        try:
            importlib.import_module(module)
            return load_consumer(target)
        except ModuleNotFoundError as error:
            missing = (error.name or '').split('.')[0]
            if missing not in provided or missing in absent:
                raise
            absent.add(missing)
            for name in [n for n in sys.modules if n == package or n.startswith(package + '.')]:
                del sys.modules[name]


found = {}
for target in sys.argv[1:]:
    try:
        cls = load(target)
        if cls.handler is Consumer.handler:
            raise TypeError(f"{cls.__name__} does not define handler(self, message)")
        spec = cls.channel_spec("")
        if not isinstance(cls.idempotent, bool):
            raise TypeError(f"{cls.__name__}.idempotent must be True or False, got "
                            f"{cls.idempotent!r}")
        found[target] = {
            "channel": spec.name, "ordered": spec.ordered,
            "processing_timeout": float(cls.processing_timeout),
            "priorities": list(spec.priorities), "default_level": spec.default_level,
            "track_status": spec.track_status,
            "filter_policy": spec.message_filter.policy() if spec.message_filter else None,
            # Flow control the class declares (None: it takes the channel's)
            "limits": {name: getattr(cls, name, None) for name in
                       ("rate_limit", "tenant_rate_limit", "max_concurrency")},
            # As Consumer guards its handler: `idempotency_key` implies `idempotent`.
            "idempotent": cls.idempotent or cls.idempotency_key is not None,
        }
        json.dumps(found[target])
    except BaseException as error:
        message = f"{type(error).__name__}: {error}"
        if absent:
            message += (f" (with {', '.join(sorted(absent))} absent where cdk synth runs, its "
                        f"values are placeholders: install it there to check this class)")
        found[target] = {"error": message}
    if absent and "error" not in found[target]:
        found[target]["absent"] = sorted(absent)
print(json.dumps(found))
"""


def check_class_path(owner: str, consumer_class: str) -> None:
    """ValueError unless `consumer_class` names a class as 'package.module:Class' (what
    `messenger consume` and the Lambda handler load); `owner` names the construct, e.g.
    "ConsumerService 'Orders'"."""
    module, _, class_name = consumer_class.partition(":")
    if not class_name.isidentifier() or not all(
        part.isidentifier() for part in module.split(".")
    ):
        raise ValueError(
            f"{owner}: consumer_class must be 'package.module:Class', got {consumer_class!r}"
        )


def provided_modules(requirements: Path | None) -> list[str]:
    """The top-level modules a requirements file's distributions provide (by name)."""
    if requirements is None or not requirements.is_file():
        return []
    modules = set()
    for line in requirements.read_text().splitlines():
        match = _REQUIREMENT_NAME.match(line.split("#")[0])
        if match is None:
            continue  # blank, a comment, or an option such as -r / --index-url
        name = re.sub(r"[-.]+", "_", match.group(1)).lower()
        modules.add(IMPORT_NAMES.get(name, name))
    return sorted(modules)


def inspect_consumers(
    code_dir: Path, classes: Sequence[str], requirements: Path | None = None
) -> dict[str, dict[str, Any]]:
    """Import `classes` ('package.module:Class') in a fresh interpreter that sees only what the
    image holds: the `messenger` library and `code_dir` as its package. Modules that
    `requirements` provides may be absent (see the module docstring). Returns, per class, its
    channel facts (with "absent" when some were) or {'error': ...}."""
    with tempfile.TemporaryDirectory(prefix="messenger-consumer-check-") as path:
        (Path(path) / code_dir.name).symlink_to(code_dir, target_is_directory=True)
        library = Path(path) / "_library"
        library.mkdir()
        (library / "messenger").symlink_to(REPO_ROOT / "messenger", target_is_directory=True)
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([path, str(library)]),
            "PYTHONDONTWRITEBYTECODE": "1",
            "MESSENGER_CHECK_PROVIDED": json.dumps(provided_modules(requirements)),
        }
        try:
            result = subprocess.run(
                [sys.executable, "-c", _INSPECT, *classes], cwd=path, env=environment,
                capture_output=True, text=True, timeout=INSPECT_TIMEOUT,
            )
        except subprocess.TimeoutExpired:
            error = f"importing the module took more than {INSPECT_TIMEOUT} s (it hangs)"
            return {target: {"error": error} for target in classes}
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        error = (result.stderr.strip().splitlines() or ["the interpreter died silently"])[-1]
        return {target: {"error": error} for target in classes}
    found: dict[str, dict[str, Any]] = json.loads(lines[-1])  # the module may print before
    return found
