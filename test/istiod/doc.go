// Package istiod holds the tests that run a real istiod (pilot-discovery, built from the
// pinned module test/istiod/pilot; see package internal/testkit/istiodtest) against a real
// kube-apiserver (package kubetest) and an in-process hub as its MCP-over-xDS config
// source, and check what istiod ends up holding (its /debug/configz). It has no product
// code.
package istiod
