//go:build tools

// Package pilot pins the real Istio control plane (pilot-discovery) that the istiod test
// tier builds and runs. It is a separate module so the project's own go.mod stays free of
// Istio's dependency tree.
package pilot

import (
	_ "istio.io/istio/pilot/cmd/pilot-discovery"
)
