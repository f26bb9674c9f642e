package wasm

import (
	"errors"
	"fmt"
)

// Error kinds of the ABI's error object.
const (
	kindPlugin = "plugin"
	kindVendor = "vendor"
	kindStatus = "status"
)

var (
	// ErrABI is a module that does not implement proxypool ABI v1: a
	// missing or mistyped export, another version, an import the host does
	// not provide, a command module instead of a reactor. Load errors wrap
	// it.
	ErrABI = errors.New("module does not implement proxypool abi v1")
	// ErrGuestCrashed is a call that ended in a trap, a Go panic or fatal
	// error (out of memory), or an exit of the guest.
	ErrGuestCrashed = errors.New("wasm guest crashed")
	// ErrGuestTimeout is a call killed at its deadline (Config.CallTimeout).
	ErrGuestTimeout = errors.New("wasm guest exceeded its deadline")
	// ErrBadOutput is an output that breaks the ABI: a pointer outside
	// memory, an oversize or malformed JSON document.
	ErrBadOutput = errors.New("malformed wasm guest output")
	// ErrClosed is a call on an adapter or host that was closed.
	ErrClosed = errors.New("wasm plugin closed")
)

// GuestError is an error the plugin itself reported, e.g. an invalid param
// or an unreadable response. Message is bounded and free of control
// characters.
type GuestError struct {
	Message string
}

func (e *GuestError) Error() string { return "plugin reported: " + e.Message }

// EntryError is a proxy entry of a well-formed output that cannot become a
// candidate. Index is its position in the proxies list.
type EntryError struct {
	Index int
	Field string
	Err   error
}

func (e *EntryError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("proxy %d: %v", e.Index, e.Err)
	}
	return fmt.Sprintf("proxy %d: field %s: %v", e.Index, e.Field, e.Err)
}

func (e *EntryError) Unwrap() error { return e.Err }
