// Package ports hands out the loopback ports a control plane's components listen on,
// never the same one twice at once, across every captf-envtest on the machine.
//
// A port is free when it is chosen, and bound by its component seconds later (Cluster
// API's manager starts after etcd, the API server and the CRDs, half a minute under
// load). Without a record of what was handed out, two control planes starting together
// (the tests start several at once), or one control plane choosing twice, could pick the
// same port in between; the second to bind then fails with "address already in use"
// (seen in the tests, run eight at a time). So each port handed out is recorded, under
// a lock, in a directory all of them share, and not handed out again for ten minutes.
package ports

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Claimed is how long a port handed out is not handed out again.
const Claimed = 10 * time.Minute

// The range ports are chosen from: below Linux's ephemeral range (32768 and up by
// default), where the kernel never picks the local port of an outgoing connection (a
// port taken from that range could be given to one of the many connections the tests
// open before the component binds it).
const (
	low  = 20000
	span = 12000
)

// Dir is where the claims are recorded.
var Dir = filepath.Join(os.TempDir(), "captf-envtest-ports")

// Free picks a port that no process listens on now and that no captf-envtest was given
// in the last ten minutes, and records it as given.
func Free() (int, error) {
	if err := os.MkdirAll(Dir, 0o755); err != nil {
		return 0, fmt.Errorf("ports: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(Dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return 0, fmt.Errorf("ports: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return 0, fmt.Errorf("ports: locking %s: %w", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	for i := 0; i < 1000; i++ {
		port := low + rand.IntN(span)
		claim := filepath.Join(Dir, strconv.Itoa(port))
		if info, err := os.Stat(claim); err == nil && time.Since(info.ModTime()) < Claimed {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		if err := os.WriteFile(claim, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			return 0, fmt.Errorf("ports: %w", err)
		}
		return port, nil
	}
	return 0, fmt.Errorf("ports: no free port between %d and %d in 1000 tries", low, low+span-1)
}
