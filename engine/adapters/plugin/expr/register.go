package expr

import (
	"github.com/proxypool/proxypool/engine/adapters/plugin"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// Kind is the file extension of expr templates.
const Kind = "yaml"

func init() {
	plugin.RegisterKind(Kind, func(name string, data []byte) (upstream.Adapter, error) {
		a, err := Compile(name, data)
		if err != nil {
			return nil, err
		}
		return a, nil
	})
}
