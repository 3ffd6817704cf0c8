#!/usr/bin/env bash
# Regenerates the committed Go code for mcp/v1alpha1/mcp.proto.
# protoc comes from Debian's protobuf-compiler (pinned by the version check below); the two
# Go plugins are pinned by go.mod's tool directives and run through `go tool`.
set -euo pipefail
cd "$(dirname "$0")/.."
want="libprotoc 3.21.12"
have=$(protoc --version 2>/dev/null || true)
if [ "$have" != "$want" ]; then
  echo "hack/proto.sh: need '$want' (Debian bookworm protobuf-compiler), have '${have:-no protoc}'" >&2
  echo "  install it with: apt-get install -y protobuf-compiler" >&2
  exit 1
fi
istio=$(go list -m -f '{{.Dir}}' istio.io/api)
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$bin/protoc-gen-go-grpc" google.golang.org/grpc/cmd/protoc-gen-go-grpc
PATH="$bin:$PATH" protoc \
  -I . -I "$istio" -I "$istio/common-protos" -I /usr/include \
  --go_out=. --go_opt=module=github.com/meshfed/meshfed \
  --go-grpc_out=. --go-grpc_opt=module=github.com/meshfed/meshfed \
  mcp/v1alpha1/mcp.proto
