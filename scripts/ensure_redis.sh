#!/usr/bin/env bash
# Make sure a Redis answers at EAGLEGEN_REDIS_URL (default 127.0.0.1:6379).
# Order: one already answering; docker compose where a docker engine runs; a local
# redis-server (installed with apt-get when missing and possible), durable (AOF, noeviction).
# With --installed: only make sure the redis-server program is here (the tests, benchmarks
# and the demo start a Redis of their own with it); nothing is started.
set -euo pipefail

install_redis_server() {
  command -v redis-server >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "redis: installing redis-server with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
  else
    echo "redis: no redis-server and no way to install it; install Redis >= 6.2 or docker" >&2
    exit 1
  fi
}

if [ "${1:-}" = "--installed" ]; then install_redis_server; exit 0; fi
# The URL the eaglegen commands will use: the environment, else .env (as pydantic reads it).
url="${EAGLEGEN_REDIS_URL:-}"
[ -z "$url" ] && [ -f .env ] && url="$(sed -n 's/^EAGLEGEN_REDIS_URL=//p' .env | tail -n 1)"
url="${url:-redis://127.0.0.1:6379/0}"
case "$url" in
  redis://*) ;;
  *) echo "redis: ${url%%://*}:// URL, not checked here (eaglegen checks it at start)"; exit 0 ;;
esac
authority="${url#*://}"; authority="${authority%%/*}"; auth=""
case "$authority" in *@*) auth="${authority%@*}" ;; esac
hostport="${authority##*@}"
user="${auth%%:*}"; pass="${auth#*:}"; [ "$pass" = "$auth" ] && pass=""
pass="$(printf '%b' "${pass//%/\\x}")"  # percent-decoded, as redis-py reads it
host="${hostport%%:*}"; port="${hostport##*:}"; [ "$port" = "$host" ] && port=6379
state_dir="${EAGLEGEN_STATE_DIR:-$(pwd)/.eaglegen}"

answers() {
  if command -v redis-cli >/dev/null 2>&1; then
    # The password goes in the environment, not on redis-cli's command line (ps shows that).
    reply="$(REDISCLI_AUTH="$pass" redis-cli -h "$host" -p "$port" ${user:+--user "$user"} \
      ping 2>/dev/null)" || true
    case "$reply" in
      *WRONGPASS*|*NOAUTH*|*NOPERM*)
        echo "redis: $host:$port answers but refuses these credentials: $reply" >&2; exit 1 ;;
    esac
    [ "$reply" = PONG ]
  else
    (exec 3<>"/dev/tcp/$host/$port" && printf 'PING\r\n' >&3 && head -c 5 <&3 | grep -q PONG) 2>/dev/null
  fi
}

if answers; then echo "redis: answering at $host:$port"; exit 0; fi
if [ "$host" != "127.0.0.1" ] && [ "$host" != "localhost" ]; then
  echo "redis: nothing answers at $host:$port and it is not local; start it there" >&2; exit 1
fi
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
  docker compose up -d redis
else
  install_redis_server
  mkdir -p "$state_dir/redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --dir "$state_dir/redis" \
    --appendonly yes --appendfsync everysec --maxmemory-policy noeviction \
    --maxmemory "${EAGLEGEN_REDIS_MAXMEMORY:-2gb}" --logfile "$state_dir/redis/redis.log" \
    --pidfile "$state_dir/redis/redis.pid"
fi
for _ in $(seq 1 100); do answers && { echo "redis: started on $host:$port"; exit 0; }; sleep 0.1; done
echo "redis: started but not answering on $host:$port" >&2; exit 1
