//go:build !linux

package relay

import "io"

// pipe is unused where there is no splice.
type pipe struct{}

// copyOne copies src to dst through a buffer held for the whole copy.
func (p *Pool) copyOne(dst io.Writer, src io.Reader) (int64, error) {
	return p.bufferCopy(dst, src)
}
