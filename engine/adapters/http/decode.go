package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strings"
)

// requireJSON refuses a body that is not declared as JSON: guessing the
// format of a write is how form posts from browsers get through.
func requireJSON(r *http.Request) *problem {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || mt != contentJSON {
		return newProblem(http.StatusUnsupportedMediaType, ptMediaType, "Content-Type must be application/json")
	}
	return nil
}

// decodeStrict decodes exactly one JSON value into v: unknown fields,
// wrong types and trailing data are client errors. A body over the
// surface's bound comes back as *http.MaxBytesError (413).
func decodeStrict(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	switch _, err := dec.Token(); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return jsonError(err)
	default:
		return errBadRequest("invalid JSON body: unexpected data after the JSON value")
	}
}

func jsonError(err error) error {
	var (
		mbe *http.MaxBytesError
		se  *json.SyntaxError
		ute *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &mbe):
		return mbe
	case errors.Is(err, io.EOF):
		return errBadRequest("invalid JSON body: empty")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errBadRequest("invalid JSON body: truncated")
	case errors.As(err, &se):
		return errBadRequest(fmt.Sprintf("invalid JSON body at offset %d: %v", se.Offset, strings.TrimPrefix(se.Error(), "json: ")))
	case errors.As(err, &ute):
		field := ute.Field
		if field == "" {
			field = "(body)"
		}
		t := ute.Type
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		return errBadRequest(fmt.Sprintf("invalid JSON body: field %s must be %s, got %s", field, jsonKind(t.Kind()), ute.Value))
	default:
		// Includes "unknown field", for which encoding/json has no type.
		return errBadRequest("invalid JSON body: " + strings.TrimPrefix(err.Error(), "json: "))
	}
}

// jsonKind names a Go kind the way a JSON client thinks of it.
func jsonKind(k reflect.Kind) string {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	}
	return k.String()
}
