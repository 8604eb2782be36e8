#!/bin/sh
# Runs "$@" in a private mount namespace whose /dev/shm holds only 64 KiB,
# so that dgrad's shared-memory segments cannot be created there. Skips
# (77) where mount namespaces are not allowed (not root, no unshare).
command -v unshare >/dev/null 2>&1 || { echo "no unshare: skipped"; exit 77; }
unshare -m true 2>/dev/null || { echo "no mount namespaces here: skipped"; exit 77; }
exec unshare -m sh -c 'mount -t tmpfs -o size=64k tmpfs /dev/shm && exec "$@"' sh "$@"
