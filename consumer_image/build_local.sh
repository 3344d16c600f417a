#!/usr/bin/env bash
# Build the consumer image on this machine with podman, exactly as `cdk deploy` builds the asset:
# the same staged build context (`ConsumerImage.from_code(<folder>)`), `consumer_image/Dockerfile`
# unchanged, `--build-arg APP_DIR=<folder name>`, `--platform linux/amd64` (or linux/arm64).
#
#   consumer_image/build_local.sh [--app-dir DIR] [--tag TAG] [--arch X86_64|ARM64]
#   consumer_image/build_local.sh --setup     # only the engine and the stand-in base
#   consumer_image/build_local.sh --print-env # the `podman` command of this local engine
#   --no-install: never install packages (exit 3 when they are missing; what the tests use)
#
# No registry is needed: the engine and its base images are set up once and cached in
# $MESSENGER_PODMAN_DIR (default /var/tmp/messenger-podman), so later runs only build the image:
#   1. Debian packages podman, runc, debootstrap (needs root on Debian; installed when missing);
#   2. a containers.conf for this machine (runc, cgroupfs, ulimits a container may set);
#   3. a Debian minbase root file system from the mirror apt already uses (debootstrap), imported
#      as localhost/messenger-bookworm-base;
#   4. on top, a stand-in for python:3.11-slim (consumer_image/local/python-standin.Containerfile),
#      tagged docker.io/library/python:3.11-slim in the local storage, so the Dockerfile builds
#      unchanged with --pull=never. Only this stand-in gets the host's CA certificates (pip inside
#      the build must reach the package index through this machine's proxy); the production
#      Dockerfile never does.
# Exit codes: 0 built, 1 the build failed, 2 a bad argument (one line naming it, before any
# setup), 3 the engine cannot be set up here (one line saying why).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HERE")"
STATE="${MESSENGER_PODMAN_DIR:-/var/tmp/messenger-podman}"
# The Python that stages the build context (the project's venv, with aws-cdk-lib installed).
PYTHON="${CONSUMER_IMAGE_PYTHON:-$ROOT/.venv/bin/python}"
BASE_IMAGE="localhost/messenger-bookworm-base"
STANDIN_IMAGE="docker.io/library/python:3.11-slim"
STANDIN_FILE="$HERE/local/python-standin.Containerfile"
HOST_CA_BUNDLE="${MESSENGER_HOST_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
PACKAGES=(podman runc debootstrap containernetworking-plugins iptables)

APP_DIR="$ROOT/examples"
TAG="localhost/messenger-consumer:local"
ARCH="X86_64"
MODE="build"
INSTALL=1

usage() {
    sed -n '6,9p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
cannot() { echo "consumer image: cannot set up podman here: $*" >&2; exit 3; }
say() { echo "consumer image: $*" >&2; }

while [ "$#" -gt 0 ]; do
    case "$1" in
        --app-dir) APP_DIR="${2:?--app-dir needs a folder}"; shift 2 ;;
        --tag) TAG="${2:?--tag needs an image name}"; shift 2 ;;
        --arch) ARCH="${2:?--arch needs X86_64 or ARM64}"; shift 2 ;;
        --setup) MODE="setup"; shift ;;
        --print-env) MODE="print-env"; shift ;;
        --no-install) INSTALL=0; shift ;;
        -h|--help) usage ;;
        *) echo "consumer image: unknown argument '$1'" >&2; usage ;;
    esac
done

# The service's folder as the caller named it (relative to the caller's directory).
APP_DIR="$(realpath -m -- "$APP_DIR")"
PODMAN=(podman --root "$STATE/storage" --runroot "$STATE/run" --storage-driver overlay)
TEMPORARY=()  # removed on exit, however the script ends
trap 'rm -rf "${TEMPORARY[@]}"' EXIT
export CONTAINERS_CONF="$STATE/containers.conf"

if [ "$MODE" = "print-env" ]; then
    # Lines for `eval`: export CONTAINERS_CONF=... and PODMAN='podman --root ...'.
    printf 'export CONTAINERS_CONF=%q\n' "$CONTAINERS_CONF"
    printf 'export PODMAN=%q\n' "$(printf '%q ' "${PODMAN[@]}")"
    exit 0
fi

install_packages() {
    local missing=()
    for command in podman runc debootstrap; do
        command -v "$command" >/dev/null || missing+=("$command")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    [ "$INSTALL" -eq 1 ] || cannot "${missing[*]} not installed (\`make consumer-image-engine\` \
installs them: root on Debian)"
    [ "$(id -u)" -eq 0 ] || cannot "${missing[*]} not installed and not root (run as root once)"
    command -v apt-get >/dev/null || cannot "${missing[*]} not installed and no apt-get (Debian only)"
    say "installing ${PACKAGES[*]}"
    local started=$SECONDS
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${PACKAGES[@]}" \
        >/dev/null
    say "packages installed in $((SECONDS - started)) s"
}

write_containers_conf() {
    # No CAP_SYS_RESOURCE here: podman's default nofile limit (1048576) cannot be set, so ask
    # for limits a container may set. A cgroup v1/v2 hybrid that crun refuses: runc, cgroupfs.
    # No systemd: health checks run when triggered (`podman healthcheck run`), never by a timer.
    mkdir -p "$STATE"
    cat > "$STATE/containers.conf.new" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
    mv "$STATE/containers.conf.new" "$CONTAINERS_CONF"
}

debian_mirror() {
    # The mirror apt already uses (deb822 .sources or a classic sources.list line).
    local mirror
    mirror="$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list.d/*.sources \
        2>/dev/null || true)"
    if [ -z "$mirror" ]; then
        mirror="$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) \
            if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null || true)"
    fi
    echo "${mirror:-http://deb.debian.org/debian}"
}

ensure_base() {
    "${PODMAN[@]}" image exists "$BASE_IMAGE" && return 0
    local suite rootfs tarball="$STATE/bookworm-minbase.tar" started=$SECONDS
    if [ ! -s "$tarball" ]; then
        # shellcheck disable=SC1091
        suite="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
        [ "$suite" = "bookworm" ] || cannot "debootstrap needs Debian bookworm (found '${suite:-?}')"
        rootfs="$(mktemp -d "$STATE/rootfs.XXXXXX")"
        TEMPORARY+=("$rootfs" "$tarball.partial")
        say "debootstrap bookworm minbase from $(debian_mirror) (once, about a minute)"
        # python3.11-venv brings ensurepip, so the stand-in has pip as the official image does
        # (its python3.11-distutils is a virtual package that debootstrap cannot resolve).
        debootstrap --variant=minbase \
            --include=python3.11,python3.11-venv,python3-distutils,ca-certificates \
            bookworm "$rootfs" "$(debian_mirror)" >"$STATE/debootstrap.log" 2>&1 \
            || cannot "debootstrap failed (see $STATE/debootstrap.log)"
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -cf "$tarball.partial" .
        mv "$tarball.partial" "$tarball"
    fi
    "${PODMAN[@]}" import --quiet "$tarball" "$BASE_IMAGE" >/dev/null
    say "$BASE_IMAGE ready in $((SECONDS - started)) s"
}

ensure_standin() {
    # Rebuilt when its Containerfile or the host's CA bundle changes (a label holds their hash).
    local digest current context started=$SECONDS
    [ -r "$HOST_CA_BUNDLE" ] || HOST_CA_BUNDLE=/dev/null  # no extra trust to hand over
    digest="$(cat "$STANDIN_FILE" "$HOST_CA_BUNDLE" | sha256sum | cut -c1-16)"
    current="$("${PODMAN[@]}" image inspect --format '{{index .Labels "messenger.standin"}}' \
        "$STANDIN_IMAGE" 2>/dev/null || true)"
    [ "$current" = "$digest" ] && return 0
    say "building the python:3.11-slim stand-in (once, ~10 s)"
    context="$(mktemp -d "$STATE/standin.XXXXXX")"
    TEMPORARY+=("$context")
    cp "$HOST_CA_BUNDLE" "$context/host-ca-certificates.crt"
    "${PODMAN[@]}" build --quiet --pull=never --network host --format docker \
        --label "messenger.standin=$digest" -f "$STANDIN_FILE" -t "$STANDIN_IMAGE" "$context" \
        >/dev/null || cannot "the stand-in base failed to build"
    say "$STANDIN_IMAGE (stand-in) ready in $((SECONDS - started)) s"
}

setup_engine() {
    [ "$(uname -s)" = "Linux" ] || cannot "podman runs containers on Linux only"
    install_packages
    [ "$(id -u)" -eq 0 ] || cannot "not root (this script runs podman rootful with its own storage)"
    mkdir -p "$STATE"
    exec 9>"$STATE/setup.lock"
    flock 9  # one setup at a time (parallel test sessions, make targets)
    write_containers_conf
    ensure_base
    ensure_standin
    flock -u 9
}

stage_context() {
    # Stage the context with the CDK app's own code, so this build sees what `cdk deploy` sends:
    # the library, the Dockerfile and entrypoint, the service's folder (and its requirements.txt).
    # Before any engine setup: a wrong folder fails at once.
    local staged
    CONTEXT="$(mktemp -d "${TMPDIR:-/tmp}/messenger-consumer-context.XXXXXX")"
    TEMPORARY+=("$CONTEXT")
    staged="$(cd "$ROOT" && JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION=1 \
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 "$PYTHON" - \
        "$APP_DIR" "$ARCH" "$CONTEXT" <<'EOF'
import shutil
import sys

from stacks.consumer_image import PLATFORMS, ConsumerImage, ConsumerImageError

code_dir, architecture, target = sys.argv[1:4]
try:
    image = ConsumerImage.from_code(code_dir)
    if architecture not in PLATFORMS:
        raise ConsumerImageError(
            f"--arch must be one of {', '.join(PLATFORMS)}, got {architecture!r}")
except ConsumerImageError as error:
    sys.exit(f"consumer image: {error}")
shutil.copytree(image.build_context(), target, dirs_exist_ok=True)
print(image.package, PLATFORMS[architecture].platform)
EOF
    )" || exit 2
    read -r PACKAGE PLATFORM <<<"$staged"
}

build_image() {
    local started=$SECONDS
    say "building $TAG (APP_DIR=$PACKAGE, $PLATFORM)"
    "${PODMAN[@]}" build --pull=never --format docker --network host \
        --platform "$PLATFORM" --build-arg "APP_DIR=$PACKAGE" \
        -f "$CONTEXT/consumer_image/Dockerfile" -t "$TAG" "$CONTEXT" || exit 1
    say "$TAG built in $((SECONDS - started)) s"
}

if [ "$MODE" = "build" ]; then
    stage_context
fi
setup_engine
if [ "$MODE" = "build" ]; then
    build_image
fi
