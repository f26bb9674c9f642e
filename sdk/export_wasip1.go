//go:build wasip1

//lint:file-ignore U1000 the functions are exported to the host with go:wasmexport

package sdk

import "unsafe"

// maxAlloc bounds one buffer the host may ask for; the host's own bound on
// inputs is lower.
const maxAlloc = 64 << 20

// pinned holds every buffer whose address the host knows: the Go collector
// cannot see references held outside the module, so without this an input
// could be freed while the host writes it, or an output before the host
// copies it. The collector does not move objects, so the address stays
// valid while the buffer is here.
var pinned = map[uint32][]byte{}

func pin(b []byte) uint32 {
	p := uint32(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	pinned[p] = b
	return p
}

// take unpins an input buffer and returns its first size bytes; nil when
// the host passes no buffer (0, 0) or a pointer it did not get from
// proxypool_alloc.
func take(ptr, size uint32) []byte {
	if size == 0 {
		return nil
	}
	b, ok := pinned[ptr]
	delete(pinned, ptr)
	if !ok || uint32(len(b)) < size {
		return nil
	}
	return b[:size]
}

func output(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(pin(b))<<32 | uint64(len(b))
}

//go:wasmexport proxypool_abi_version
func proxypoolABIVersion() int32 { return ABIVersion }

//go:wasmexport proxypool_alloc
func proxypoolAlloc(size uint32) uint32 {
	if size > maxAlloc {
		return 0
	}
	// A zero-size request still gets a distinct address.
	return pin(make([]byte, max(size, 1)))
}

//go:wasmexport proxypool_free
func proxypoolFree(ptr, size uint32) { delete(pinned, ptr) }

//go:wasmexport proxypool_describe
func proxypoolDescribe() uint64 { return output(handleDescribe()) }

//go:wasmexport proxypool_build_request
func proxypoolBuildRequest(ptr, size uint32) uint64 {
	return output(handleBuild(take(ptr, size)))
}

//go:wasmexport proxypool_parse_response
func proxypoolParseResponse(ptr, size, bodyPtr, bodySize uint32) uint64 {
	return output(handleParse(take(ptr, size), take(bodyPtr, bodySize)))
}
