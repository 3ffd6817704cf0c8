//go:build tools

// Package kube pins the real kube-apiserver and etcd that the integration tests build and
// run. It is a separate module so the project's own go.mod stays free of Kubernetes' server
// dependencies.
package kube

import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
