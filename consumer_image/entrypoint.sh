#!/bin/sh
# PID 1 of the consumer container. `exec` hands PID 1 to `messenger consume`, which turns SIGTERM
# into a graceful shutdown. Accepts either a consumer class (the image's CMD) or a full
# `messenger consume <class>` command (what an ECS task definition may pass).
set -eu
if [ "$#" -eq 0 ]; then
    echo "usage: <package.module:ConsumerClass> | messenger consume <package.module:ConsumerClass>" >&2
    exit 2
fi
if [ "$1" = "messenger" ]; then
    exec "$@"
fi
exec messenger consume "$@"
