#!/usr/bin/env bash
# Makes the credentials of the compose stack in deploy/secrets/ and
# deploy/.env, for trying the stack out (use your own CA and keep the
# tokens in a secret store for anything real):
#
#   deploy/secrets.sh
#
# - ca.crt, tls.crt, tls.key: a CA and a certificate for telemetryd,
#   the cluster's node-0..2 and localhost (openssl);
# - auth.json: the gateway "simulator" (publishes for every device) and
#   the tokens grafana (read), prometheus (metrics) and admin (every
#   scope), as SHA-256 hashes only;
# - admin.token, metrics.token: those tokens' secrets; .env: the
#   simulator's secret, Grafana's token, and for compose-cluster.yaml
#   the node-to-node token and the shared cursor key.
#
# Needs openssl and either telemetryd on PATH or Go (go run). Refuses to
# overwrite existing secrets.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=$here/secrets
if [[ -e $out/auth.json ]]; then
	echo "$out/auth.json exists; remove $out to start over" >&2
	exit 1
fi
mkdir -p "$out"
chmod 0755 "$out"
if command -v telemetryd >/dev/null; then
	tdauth() { telemetryd auth "$@" -auth-file "$out/auth.json"; }
else
	tdauth() { (cd "$here/.." && go run ./cmd/telemetryd auth "$@" -auth-file "$out/auth.json"); }
fi

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
	-subj "/CN=telemetryd compose CA" -keyout "$out/ca.key" -out "$out/ca.crt" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=telemetryd" \
	-keyout "$out/tls.key" -out "$out/tls.csr" 2>/dev/null
openssl x509 -req -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial -days 825 \
	-extfile <(printf 'subjectAltName=DNS:telemetryd,DNS:node-0,DNS:node-1,DNS:node-2,DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n') \
	-out "$out/tls.crt" 2>/dev/null
rm -f "$out/tls.csr" "$out/ca.srl"

sim=$(tdauth add-device simulator -publish-as '*')
grafana=$(tdauth add-token grafana -scopes read)
tdauth add-token prometheus -scopes metrics >"$out/metrics.token"
tdauth add-token admin -scopes read,write,admin,metrics >"$out/admin.token"
# compose-cluster.yaml: the nodes call each other with this secret (the
# cluster credential; not a token of the auth file, so no client has it).
cluster=$(openssl rand -hex 32)
cursor=$(openssl rand -hex 32)
# The container user (uid 10001) reads these; the CA key is not needed
# by any container.
chmod 0644 "$out/auth.json" "$out/tls.key" "$out/metrics.token" "$out/ca.crt" "$out/tls.crt"
chmod 0600 "$out/ca.key" "$out/admin.token"
umask 077
printf 'TELEMETRY_SIM_SECRET=%s\nTELEMETRYD_GRAFANA_TOKEN=%s\nTELEMETRYD_CLUSTER_TOKEN=%s\nTELEMETRYD_CURSOR_KEY=%s\n' \
	"$sim" "$grafana" "$cluster" "$cursor" >"$here/.env"
echo "secrets in $out; admin token in $out/admin.token:"
echo "  curl --cacert $out/ca.crt -H \"Authorization: Bearer \$(cat $out/admin.token)\" https://localhost:8080/v1/devices"
