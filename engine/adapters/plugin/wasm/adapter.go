package wasm

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/plugin"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// Adapter is a loaded WASM plugin. It is safe for concurrent use: calls
// take an instance from the plugin's pool.
type Adapter struct {
	name string
	desc plugin.Description
	p    *pool
}

var (
	_ upstream.Adapter = (*Adapter)(nil)
	_ plugin.Describer = (*Adapter)(nil)
)

// open instantiates the first instance, checks the ABI version and reads the
// declaration; the instance then waits in the pool for the first fetch.
func (p *pool) open(ctx context.Context, name string) (*Adapter, error) {
	in, err := p.get(ctx)
	if err != nil {
		return nil, err
	}
	res, err := in.fns[exportABIVersion].Call(ctx)
	if err != nil {
		p.discard(in)
		return nil, fmt.Errorf("%s: %w", exportABIVersion, describeFailure(ctx, err, in.out))
	}
	if v := int32(uint32(res[0])); v != ABIVersion {
		p.discard(in)
		return nil, fmt.Errorf("checking wasm module: %w: %s returned %d, this host implements %d", ErrABI, exportABIVersion, v, ABIVersion)
	}
	p.put(in)
	a := &Adapter{name: name, p: p}
	err = p.call(ctx, time.Time{}, exportDescribe, nil, func(out []byte) error {
		d, err := decodeDescription(out)
		a.desc = d
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reading plugin declaration: %w", err)
	}
	return a, nil
}

// Name is the plugin name.
func (a *Adapter) Name() string { return a.name }

// Describe reports the params and secrets the plugin declared.
func (a *Adapter) Describe() plugin.Description {
	return plugin.Description{
		Text:    a.desc.Text,
		Params:  append([]plugin.Param(nil), a.desc.Params...),
		Secrets: append([]string(nil), a.desc.Secrets...),
	}
}

// Close releases the plugin's instances and compiled code; later calls fail
// with ErrClosed. Dropping the adapter has the same effect, eventually.
func (a *Adapter) Close() error {
	a.p.close()
	return nil
}

// Stats are counters of a plugin's instance pool.
type Stats struct {
	Live      int    // instances in existence, busy or idle
	Idle      int    // instances waiting in the pool
	Created   uint64 // instances created since load
	Discarded uint64 // instances closed: crashed, timed out, bad output, oversized, or pool closed
}

// Stats reports the pool's counters.
func (a *Adapter) Stats() Stats {
	return Stats{Live: len(a.p.slots), Idle: len(a.p.idle), Created: a.p.created.Load(), Discarded: a.p.discarded.Load()}
}

// BuildRequest checks the inputs against the declaration, applies defaults
// and asks the guest for the request.
func (a *Adapter) BuildRequest(ctx context.Context, in upstream.BuildInput) (upstream.Request, error) {
	params, err := a.resolveParams(in.Params, true)
	if err != nil {
		return upstream.Request{}, err
	}
	secrets, err := a.resolveSecrets(in.Secrets)
	if err != nil {
		return upstream.Request{}, err
	}
	if in.Count < 0 {
		return upstream.Request{}, fmt.Errorf("negative count %d", in.Count)
	}
	input, err := encodeInput(wireBuildInput{Params: params, Secrets: secrets, Count: in.Count, Now: in.Now.UTC()})
	if err != nil {
		return upstream.Request{}, err
	}
	var req upstream.Request
	err = a.p.call(ctx, in.Now, exportBuild, [][]byte{input}, func(out []byte) error {
		var err error
		req, err = decodeBuildOutput(out)
		return err
	})
	return req, err
}

// ParseResponse hands the response to the guest and decodes its result.
func (a *Adapter) ParseResponse(ctx context.Context, resp upstream.Response, now time.Time) (upstream.ParseResult, error) {
	params, _ := a.resolveParams(resp.Params, false)
	headers := resp.Headers
	if headers == nil {
		headers = map[string]string{}
	}
	input, err := encodeInput(wireResponse{Status: resp.Status, Headers: headers, Params: params, Now: now.UTC()})
	if err != nil {
		return upstream.ParseResult{}, err
	}
	if len(resp.Body) > MaxBodyBytes {
		return upstream.ParseResult{}, fmt.Errorf("response body of %d bytes, more than %d for a wasm plugin", len(resp.Body), MaxBodyBytes)
	}
	var res upstream.ParseResult
	// The body travels raw, beside the JSON document: inside it, it would
	// be base64, and every byte scanned in the guest costs a deadline check.
	err = a.p.call(ctx, now, exportParse, [][]byte{input, resp.Body}, func(out []byte) error {
		var err error
		res, err = decodeParseOutput(out)
		return err
	})
	return res, err
}

func encodeInput(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding plugin input: %w", err)
	}
	if len(b) > MaxInputBytes {
		return nil, fmt.Errorf("encoding plugin input: %d bytes, more than %d", len(b), MaxInputBytes)
	}
	return b, nil
}

// resolveParams applies defaults. strict (request side) refuses undeclared
// and missing required params; the response side is lenient because the
// request already enforced them and a dry run may not pass them all.
func (a *Adapter) resolveParams(in map[string]string, strict bool) (map[string]string, error) {
	return plugin.ResolveParams(a.desc.Params, in, strict)
}

// resolveSecrets maps every declared secret, "" when not supplied.
func (a *Adapter) resolveSecrets(in map[string]string) (map[string]string, error) {
	return plugin.ResolveSecrets(a.desc.Secrets, in)
}
