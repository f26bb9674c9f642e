package testenv

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. It is
// meant for servers we start as child processes, which need a port number
// before they can listen; in-process servers listen on port 0 instead.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitPortFree polls until port can be listened on again, so a restart on the
// same port does not race the old process's socket teardown.
func waitPortFree(port int, timeout time.Duration) error {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	deadline := time.Now().Add(timeout)
	ticker := time.NewTicker(20 * time.Millisecond)
	defer ticker.Stop()
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			return ln.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for port %d to be free: %w", port, err)
		}
		<-ticker.C
	}
}

// listenLoopback listens on addr (or def when addr is empty) after checking
// that it is a loopback address: a mistyped config must never expose these
// deliberately misbehaving servers to the network.
func listenLoopback(addr, def string) (net.Listener, error) {
	if addr == "" {
		addr = def
	}
	if _, err := loopbackHostPort(addr); err != nil {
		return nil, fmt.Errorf("checking listen address: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	return ln, nil
}

// loopbackHostPort validates that addr names a loopback host and returns it
// with "localhost" replaced by 127.0.0.1. Only IP literals and "localhost"
// are accepted because resolving any other name would contact a DNS server.
func loopbackHostPort(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("parsing address %q: %w", addr, err)
	}
	if host == "localhost" {
		return net.JoinHostPort("127.0.0.1", port), nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return "", errors.New("address " + addr + " is not a loopback IP")
	}
	return net.JoinHostPort(ip.String(), port), nil
}
