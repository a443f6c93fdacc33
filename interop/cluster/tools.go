//go:build tools

// Package cluster pins the control-plane programs build.sh compiles (kube-apiserver,
// kube-controller-manager, kube-scheduler, etcd, the DRA test driver) so that go.mod and
// go.sum name their exact versions. This file is never compiled.
package cluster

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/test/e2e/dra/test-driver"
)
