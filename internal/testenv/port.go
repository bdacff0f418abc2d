package testenv

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
)

// Ports for child processes come from below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range, 32768–60999 on Linux). A port probed with
// Listen(":0") comes from inside it, and between the probe and the child's
// bind any outgoing connection on this busy machine (a test's pool to
// Postgres, a client to RabbitMQ) may be given it as its local port: the
// child then fails with "address already in use". Below the range only
// another listener can take it, and listeners here are test processes that
// probe first.
const (
	portLow  = 20000
	portHigh = 32768
)

// handedOut holds every port Port has returned in this test binary, so that
// two processes of one test (or of two parallel tests) are never told the
// same one.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// Port returns a TCP port on 127.0.0.1 for a child process or a server to
// listen on: below the ephemeral range, free a moment ago (a probe bound
// it), and never returned before by this process. It fails only after 200
// tries find nothing free.
func Port() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 200 {
		port := portLow + rand.IntN(portHigh-portLow)
		if handedOut.ports[port] {
			continue
		}
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // someone listens there
		}
		ln.Close()
		handedOut.ports[port] = true
		return port, nil
	}
	return 0, errors.New("testenv: no free port below the ephemeral range after 200 tries")
}

// FreePort is Port for a test: it fails the test when no port is free.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := Port()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// FreeAddr is FreePort as "127.0.0.1:port".
func FreeAddr(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", FreePort(t))
}
