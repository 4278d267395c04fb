// Package e2e holds edgefl's end-to-end tests: the failure semantics of
// ARCHITECTURE.md, Durability and failure semantics, proved on real processes.
//
// TestMain builds edge-agent and broker-agg once into a temporary
// directory; every test then runs them as separate processes on
// 127.0.0.1 with generated configuration files, real bbolt state files in
// t.TempDir(), real signals (SIGKILL, SIGSTOP) and, where a test says so, a
// real Mosquitto (/usr/sbin/mosquitto) with the shipped ACL
// (deploy/mosquitto/edgefl.acl) and password files written by
// `broker-agg pki passwd`. Nothing sleeps for timing: every wait polls an
// observable (the aggregator's /metrics, a JSON log line, a process exit)
// under a deadline. TestHospitalExample and TestGenericExampleConfigs run
// the shipped configuration files of deploy/ instead of generated ones (each
// lists in its comment the few settings it changes).
//
// Run it alone, it uses both cores for a couple of minutes:
//
//	go test ./e2e/
//
// `go test -short` skips the package. Without Mosquitto installed the tests
// that need it fail (scripts/test.sh installs it).
//
// e2e/cmd/loadtest is the load generator of scripts/bench-e2e.sh: many edge
// agents in one process against an external broker.
package e2e
