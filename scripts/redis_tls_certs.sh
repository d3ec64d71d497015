#!/usr/bin/env bash
# Make a private CA, a Redis server certificate and a client certificate for rediss://.
#   scripts/redis_tls_certs.sh DIR [NAME...]
# NAME: each host name or IP address the workers use to reach Redis (default: localhost
# 127.0.0.1). Writes DIR/ca.crt, DIR/redis.{crt,key} and DIR/client.{crt,key}; keeps
# DIR/ca.key for later certificates. Keys are readable by their owner only.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [NAME...]" >&2; exit 2; }
dir="$1"; shift
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(localhost 127.0.0.1)
days="${EAGLEGEN_TLS_DAYS:-825}"

san=""
for name in "${names[@]}"; do
  if [[ "$name" =~ ^[0-9.]+$ || "$name" == *:* ]]; then san+="IP:$name,"; else san+="DNS:$name,"; fi
done
san="${san%,}"

mkdir -p "$dir"
umask 077
cd "$dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

[ -f ca.key ] || key ca.key
openssl req -x509 -new -key ca.key -sha256 -days "$days" -subj "/CN=eaglegen-redis-ca" \
  -out ca.crt

sign() {  # sign NAME SUBJECT EXTENSIONS
  key "$1.key"
  openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
  printf '%s\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 \
    -days "$days" -extfile "$1.ext" -out "$1.crt" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
sign redis "/CN=${names[0]}" "subjectAltName=$san
extendedKeyUsage=serverAuth"
sign client "/CN=eaglegen-client" "extendedKeyUsage=clientAuth"
chmod 644 ca.crt redis.crt client.crt  # certificates are public, keys are not
echo "wrote $dir/ca.crt, redis.crt/.key (for: ${names[*]}), client.crt/.key"
