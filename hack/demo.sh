#!/usr/bin/env bash
# make demo: a hub with its own development CA, two minions publishing
# examples/clusters/east and examples/clusters/west over mutual TLS, and a sink that prints
# what the hub serves it — all on 127.0.0.1, until Ctrl-C.
#
# The example clusters overlap on purpose: both publish istio-system/default (a conflict:
# the older one is served, the other held) and west claims a host east owns (refused, with
# the reason). Try, while it runs:
#   .cache/demo/bin/hub status
#   .cache/demo/bin/hub why istio/networking/v1alpha3/virtualservices pay/steal-cart
#   .cache/demo/bin/hub why istio/security/v1beta1/peerauthentications istio-system/default
#
# Environment: DEMO_DIR (default .cache/demo), DEMO_INGEST / DEMO_SERVE / DEMO_HTTP
# (default 127.0.0.1:9901 / :9900 / :9990). DEMO_CHECK=1 stops by itself once the sink
# shows the expected state and exits 0 (1 after 90 s without it): the tests use that.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${DEMO_DIR:-.cache/demo}
INGEST=${DEMO_INGEST:-127.0.0.1:9901}
SERVE=${DEMO_SERVE:-127.0.0.1:9900}
HTTP=${DEMO_HTTP:-127.0.0.1:9990}
rm -rf "$DIR"
mkdir -p "$DIR/bin" "$DIR/certs"
DIR=$(cd "$DIR" && pwd)

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== building hub and minion"
go build -o "$DIR/bin/" ./cmd/hub ./cmd/minion

cat > "$DIR/hub.yaml" <<YAML
devCA: true
stateDir: $DIR/state
ingest: $INGEST
serve: $SERVE
http: $HTTP
warmUp: 30s
clusters:
- name: east
  namespaces: [shop, istio-system]
  hosts: ["*.shop.svc.cluster.local", shop.example.com, api.payments.example.com]
- name: west
  namespaces: [pay, istio-system]
  hosts: ["*.pay.svc.cluster.local"]
sharedNamespaces: [istio-system]
routing:
  default: {name: everything}
YAML

echo "== starting the hub (development CA in $DIR/state)"
"$DIR/bin/hub" -config "$DIR/hub.yaml" >"$DIR/hub.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -f "$DIR/state/tls/hub.crt" ] && break; sleep 0.1; done
[ -f "$DIR/state/tls/hub.crt" ] || { echo "the hub did not start:"; cat "$DIR/hub.log"; exit 1; }

echo "== issuing certificates"
for c in east west; do "$DIR/bin/hub" certs issue -cluster "$c" -out "$DIR/certs" -state-dir "$DIR/state"; done
"$DIR/bin/hub" certs issue -sink demo-sink -out "$DIR/certs" -state-dir "$DIR/state"

for c in east west; do
  cat > "$DIR/minion-$c.yaml" <<YAML
cluster: $c
sources: [{url: "fs://$PWD/examples/clusters/$c"}]
destinations: {push: ["push://$INGEST"]}
http: ""
tls: {certFile: $DIR/certs/$c.crt, keyFile: $DIR/certs/$c.key, caFile: $DIR/certs/ca.crt}
YAML
  echo "== starting minion $c"
  "$DIR/bin/minion" -config "$DIR/minion-$c.yaml" >"$DIR/minion-$c.log" 2>&1 &
  pids+=($!)
done

echo "== a sink subscribing to $SERVE (what it receives follows)"
"$DIR/bin/hub" subscribe -serve "$SERVE" -cert "$DIR/certs/demo-sink.crt" -key "$DIR/certs/demo-sink.key" \
  -ca "$DIR/certs/ca.crt" -node demo-sink >"$DIR/sink.log" 2>&1 &
pids+=($!)

if [ "${DEMO_CHECK:-}" = 1 ]; then
  want=("pay/payments from west" "shop/cart from east" "istio-system/default from west" "istio-system/shop-gateway from east")
  for _ in $(seq 900); do
    ok=1
    for w in "${want[@]}"; do grep -q "$w" "$DIR/sink.log" || ok=0; done
    if [ $ok = 1 ]; then
      why=$("$DIR/bin/hub" why -admin "$HTTP" istio/networking/v1alpha3/virtualservices pay/steal-cart)
      echo "$why"
      if grep -q 'refused from cluster west: host "cart.shop.svc.cluster.local"' <<<"$why"; then
        cat "$DIR/sink.log"
        echo "demo: OK"
        exit 0
      fi
    fi
    sleep 0.1
  done
  echo "demo: the sink did not show the expected state in 90 s"
  for f in sink hub minion-east minion-west; do echo "--- $f.log"; tail -20 "$DIR/$f.log"; done
  exit 1
fi

echo "(logs in $DIR; try: $DIR/bin/hub status -admin $HTTP, or open http://$HTTP/ (the dashboard); Ctrl-C stops everything)"
tail -n +1 -f "$DIR/sink.log"
