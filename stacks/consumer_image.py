"""`ConsumerImage`: what a `ConsumerService` runs — a service's own code folder or a ready image.

`ConsumerImage.from_code("orders")` stages, at synth time and in plain Python, the build context
of `consumer_image/Dockerfile`: the `messenger` library (with the pinned requirements), the
Dockerfile and its entrypoint, and the folder `orders/` (plus its `requirements.txt`). The
Dockerfile copies the folder to `/app/orders` (build argument `APP_DIR=orders`), so the consumer
class is `orders.<module>:<Class>`, as in `messenger consume orders.consumers:OrderConsumer`.

The image platform is always the task's: `ConsumerService` binds the image for its CPU
architecture (default X86_64, `linux/amd64`), so an image built on an arm64 laptop still runs on
the task definition. Why X86_64 by default: `cdk deploy` builds the image on the deploying
machine, and CI runners and most build hosts are x86_64, where an amd64 build is native; an
arm64 image there needs QEMU emulation (slow, and a service's C extensions compile under
emulation). Graviton is about 20 % cheaper per vCPU-hour on Fargate: pass
`cpu_architecture="ARM64"` to the service and the image follows (`linux/arm64`).
"""

from __future__ import annotations

import hashlib
import keyword
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_ecs as ecs

from stacks.bundle import IGNORE_CODE, REPO_ROOT, staging_root

CONSUMER_DOCKERFILE = "consumer_image/Dockerfile"
#: What the Dockerfile needs from the repository besides the service's folder (only these, so
#: the local build tools in consumer_image/ never change an image asset's hash).
LIBRARY_FILES = (
    "messenger", "consumer_image/Dockerfile", "consumer_image/entrypoint.sh",
    "pyproject.toml", "requirements.txt", "README.md",
)
#: The Docker platform of each Fargate CPU architecture (`ecs.CpuArchitecture.of(name)`).
PLATFORMS = {"X86_64": ecr_assets.Platform.LINUX_AMD64, "ARM64": ecr_assets.Platform.LINUX_ARM64}
DEFAULT_ARCHITECTURE = "X86_64"


class ConsumerImageError(ValueError):
    """A consumer image cannot be built from what was given (names the field and the fix)."""


@dataclass(frozen=True)
class ConsumerImage:
    """The image of a `ConsumerService`. Build one with `from_code` or `from_image`.

    code_dir: the service's folder (its name is the package: `<folder>.<module>:<Class>`).
    requirements: a requirements file installed into the image (default: the folder's own
        `requirements.txt` when there is one).
    ready: a ready-made image (`ecs.ContainerImage.from_ecr_repository(...)`); its platform and
        contents are the caller's responsibility, and consumer classes are not checked at synth.
    """

    code_dir: Path | None = None
    requirements: Path | None = None
    ready: ecs.ContainerImage | None = field(default=None, compare=False)

    @classmethod
    def from_code(
        cls, code_dir: str | Path, *, requirements: str | Path | None = None
    ) -> ConsumerImage:
        """The library plus `code_dir` (relative paths: to the directory `cdk synth` runs in)."""
        folder = Path(code_dir).resolve()
        if not folder.is_dir():
            raise ConsumerImageError(
                f"ConsumerImage.from_code: code_dir {str(code_dir)!r} is not a folder "
                f"(resolved to {folder}); give the folder holding the consumer classes"
            )
        package = folder.name
        if not package.isidentifier() or keyword.iskeyword(package):
            raise ConsumerImageError(
                f"ConsumerImage.from_code: the folder name {package!r} is the package of its "
                f"consumer classes ('{package}.<module>:<Class>') and must be a Python "
                f"identifier; rename it (e.g. {package.replace('-', '_')!r})"
            )
        if package == "messenger":
            raise ConsumerImageError(
                "ConsumerImage.from_code: a folder named 'messenger' would shadow the library; "
                "rename the service's folder"
            )
        own = folder / "requirements.txt"
        chosen = None
        if requirements is not None:
            chosen = Path(requirements).resolve()
            if not chosen.is_file():
                raise ConsumerImageError(
                    f"ConsumerImage.from_code: requirements {str(requirements)!r} is not a file"
                )
            if own.is_file() and chosen != own:
                raise ConsumerImageError(
                    f"ConsumerImage.from_code: {folder} has its own requirements.txt and "
                    f"requirements={str(requirements)!r} names another file; keep one"
                )
        elif own.is_file():
            chosen = own
        return cls(code_dir=folder, requirements=chosen)

    @classmethod
    def from_image(cls, image: ecs.ContainerImage) -> ConsumerImage:
        """A ready image (it must run `consumer-entrypoint` or `messenger consume`)."""
        return cls(ready=image)

    @property
    def package(self) -> str | None:
        """The top-level package of the service's code (None for a ready image)."""
        return self.code_dir.name if self.code_dir is not None else None

    def contains(self, consumer_class: str) -> bool:
        """Whether `consumer_class` ('package.module:Class') can be in this image at all."""
        if self.package is None:
            return True
        module = consumer_class.partition(":")[0]
        return module.split(".")[0] == self.package

    def container_image(self, architecture: str) -> ecs.ContainerImage:
        """The image for a task of `architecture` ('X86_64' or 'ARM64'): built for that
        platform, or the ready one."""
        if architecture not in PLATFORMS:
            raise ConsumerImageError(
                f"cpu_architecture must be one of {', '.join(PLATFORMS)}, got {architecture!r}"
            )
        if self.ready is not None:
            return self.ready
        assert self.code_dir is not None and self.package is not None
        return ecs.ContainerImage.from_asset(
            str(self.build_context()),
            file=CONSUMER_DOCKERFILE,
            build_args={"APP_DIR": self.package},
            platform=PLATFORMS[architecture],
        )

    def build_context(self) -> Path:
        """The staged Docker build context (made once per folder and requirements)."""
        assert self.code_dir is not None and self.package is not None
        digest = hashlib.sha256(f"{self.code_dir}|{self.requirements}".encode()).hexdigest()[:12]
        target = staging_root() / f"consumer-{self.package}-{digest}"
        if target.exists():
            return target
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        for name in LIBRARY_FILES:
            source = REPO_ROOT / name
            if source.is_dir():
                shutil.copytree(source, partial / name, ignore=IGNORE_CODE)
            elif source.is_file():
                (partial / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, partial / name)
        shutil.copytree(self.code_dir, partial / self.package, ignore=IGNORE_CODE)
        if self.requirements is not None:
            shutil.copy2(self.requirements, partial / self.package / "requirements.txt")
        partial.rename(target)
        return target
