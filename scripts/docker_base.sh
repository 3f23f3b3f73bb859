#!/usr/bin/env bash
# A local Debian bookworm base image for docker/Dockerfile where no registry is reachable:
#   sudo bash scripts/docker_base.sh [NAME]   (default idolcast-base:bookworm)
# then: docker build --network host -f docker/Dockerfile --build-arg BASE=NAME -t idolcast:cpu .
set -euo pipefail
NAME=${1:-idolcast-base:bookworm}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
debootstrap --variant=minbase bookworm "$DIR/root" http://deb.debian.org/debian
tar -C "$DIR/root" -c . | docker import - "$NAME"
echo "made $NAME"
