package config

import (
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// Secret is a reference to a secret value: "env:NAME" or "file:/path". The
// value is resolved during validation and never printed: String, GoString,
// LogValue, MarshalText and MarshalJSON all render a placeholder.
type Secret struct {
	ref   string
	value string
	set   bool
}

const redacted = "REDACTED"

// ParseSecretRef validates the shape of a reference without resolving it.
func ParseSecretRef(ref string) (Secret, error) {
	kind, name, ok := strings.Cut(ref, ":")
	if !ok || name == "" {
		return Secret{}, fmt.Errorf("secret must be a reference \"env:NAME\" or \"file:/path\", got %q", redactRef(ref))
	}
	switch kind {
	case "env", "file":
	default:
		return Secret{}, fmt.Errorf("unknown secret reference kind %q (want env or file)", kind)
	}
	return Secret{ref: ref}, nil
}

// redactRef keeps only what is safe of a malformed reference: a literal
// password pasted where a reference belongs must not reach an error message.
func redactRef(ref string) string {
	if kind, _, ok := strings.Cut(ref, ":"); ok && (kind == "env" || kind == "file") {
		return ref
	}
	return redacted
}

// maxSecretFileBytes bounds a file: reference so a wrong path (a log file, a
// device) cannot exhaust memory.
const maxSecretFileBytes = 64 << 10

// Resolve reads the referenced value. It is called by validation; a failure
// names the reference, never a value.
func (s *Secret) Resolve() error {
	if s.ref == "" {
		return nil
	}
	kind, name, _ := strings.Cut(s.ref, ":")
	switch kind {
	case "env":
		v, ok := os.LookupEnv(name)
		if !ok {
			return fmt.Errorf("secret %s: environment variable %s is not set", s.ref, name)
		}
		s.value, s.set = v, true
	case "file":
		f, err := os.Open(name)
		if err != nil {
			return fmt.Errorf("secret %s: %w", s.ref, err)
		}
		defer f.Close()
		buf := make([]byte, maxSecretFileBytes+1)
		n, _ := f.Read(buf)
		if n > maxSecretFileBytes {
			return fmt.Errorf("secret %s: file larger than %d bytes", s.ref, maxSecretFileBytes)
		}
		s.value, s.set = strings.TrimRight(string(buf[:n]), "\r\n"), true
	}
	return nil
}

// Value returns the resolved secret. Only code that must use the secret (a
// provider request, an auth check) calls it.
func (s Secret) Value() string { return s.value }

// Ref is the reference text, or the placeholder when it is malformed.
func (s Secret) Ref() string { return redactRef(s.ref) }

// IsZero reports whether no reference was configured.
func (s Secret) IsZero() bool { return s.ref == "" }

func (s Secret) String() string   { return redacted }
func (s Secret) GoString() string { return redacted }

// LogValue implements slog.LogValuer.
func (s Secret) LogValue() slog.Value { return slog.StringValue(redacted) }

// UnmarshalText stores the reference; validation checks its shape so that
// every bad reference in a file is reported, not only the first.
func (s *Secret) UnmarshalText(b []byte) error {
	*s = Secret{ref: string(b)}
	return nil
}

// MarshalText renders the reference, never the value; a malformed one (a
// literal password pasted by mistake) renders as the placeholder.
func (s Secret) MarshalText() ([]byte, error) { return []byte(redactRef(s.ref)), nil }

var _ slog.LogValuer = Secret{}
