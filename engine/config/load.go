package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// MaxFileBytes bounds a configuration file.
const MaxFileBytes = 1 << 20

// FieldError is one validation problem at a path such as
// "upstreams[1].fetch.requestInterval".
type FieldError struct {
	Path string
	Msg  string
}

func (e FieldError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Errors is the complete list of problems with a configuration.
type Errors []FieldError

func (es Errors) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "invalid configuration (%d errors):", len(es))
	for _, e := range es {
		b.WriteString("\n  ")
		b.WriteString(e.Error())
	}
	return b.String()
}

// Load reads, decodes, defaults and validates the file at path. On any
// problem it returns an error listing every problem found; an Errors value
// can be recovered with errors.As.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading config %s: %w", path, err)
	}
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("reading config %s: larger than %d bytes", path, MaxFileBytes)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	c.Source = path
	sum := sha256.Sum256(data)
	c.Digest = hex.EncodeToString(sum[:])
	return c, nil
}

// Parse decodes YAML strictly (an unknown field is an error naming its
// line), applies defaults and validates.
func Parse(data []byte) (*Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var decodeErrs Errors
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, Errors{{Msg: "empty configuration"}}
		}
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, Errors{{Msg: strings.TrimPrefix(err.Error(), "yaml: ")}}
		}
		// Unknown fields and type mismatches leave the rest decoded:
		// validate it too, so one pass reports every problem.
		for _, m := range te.Errors {
			decodeErrs = append(decodeErrs, FieldError{Msg: m})
		}
	}
	// A second document is almost always a paste error; refuse it.
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, Errors{{Msg: "more than one YAML document"}}
	}
	c.applyDefaults()
	if errs := append(decodeErrs, c.validate()...); len(errs) > 0 {
		return nil, errs
	}
	return &c, nil
}
