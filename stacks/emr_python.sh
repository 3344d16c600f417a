#!/bin/bash
# EMR bootstrap action (stacks/emr_pipeline.py): the Python that steps run (`$1`, default
# /usr/bin/python3.11) exists on the node and imports boto3 (`$2`, the pinned requirement), which
# is all the messenger EMR package needs. Does nothing when both are already there.
set -euo pipefail
PYTHON="${1:-/usr/bin/python3.11}"
BOTO3="${2:-boto3}"
SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
if [ ! -x "$PYTHON" ]; then
    $SUDO dnf install -y "$(basename "$PYTHON")"
fi
if ! "$PYTHON" -c "import boto3" 2>/dev/null; then
    "$PYTHON" -m pip --version >/dev/null 2>&1 || $SUDO dnf install -y "$(basename "$PYTHON")-pip"
    $SUDO "$PYTHON" -m pip install --quiet "$BOTO3"
fi
"$PYTHON" -c "import sys, boto3; print('step python', sys.version.split()[0], 'boto3', boto3.__version__)"
