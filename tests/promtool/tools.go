//go:build tools

// Package tools pins Prometheus's promtool, which the alert rules' tests run
// (config/prometheus): tests/cluster/build builds it from this module with the build
// tag remove_all_sd, which leaves out the service discoveries promtool does not need
// to test rules.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
