#!/bin/sh
# As the official redis image's: redis-server started as root owns /data, then runs as redis.
set -e
if [ "$1" = redis-server ] && [ "$(id -u)" = 0 ]; then
  find . \! -user redis -exec chown redis '{}' +
  exec setpriv --reuid="$(id -u redis)" --regid="$(id -g redis)" --init-groups "$@"
fi
exec "$@"
