//go:build !unix

package ingress

// canWatch: there is no portable way to wait for a connection to turn
// readable without reading it, and a read would take bytes from the
// connection's reader; so clients are not watched here and a client that
// leaves during a wait is noticed at the next read or write of its
// connection.
const canWatch = false

func (c *conn) peekGone() bool { return false }
