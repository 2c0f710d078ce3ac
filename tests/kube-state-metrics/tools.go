//go:build tools

// Package tools pins kube-state-metrics, which the test of config/metrics runs against
// the test control plane: tests/cluster/build builds it from this module. Its k8s.io
// modules differ from tests/cluster's, so it is a module of its own.
package tools

import _ "k8s.io/kube-state-metrics/v2"
