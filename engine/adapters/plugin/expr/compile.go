package expr

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	exprlang "github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/parser"
	"github.com/expr-lang/expr/vm"
)

// Bounds of expression compilation and evaluation.
const (
	// MaxExprBytes bounds the source of one expression.
	MaxExprBytes = 16 << 10
	// MaxNodes bounds the AST of one expression; the shipped templates use
	// well under a hundred.
	MaxNodes = 1000
	// memoryBudget is the VM's allocation budget per call, in expr's units
	// (array and map elements, range sizes). A 10,000-proxy response mapped
	// to 10-field objects uses about 110,000.
	memoryBudget = 2_000_000
	// maxTicks bounds predicate iterations per call (map, filter, all…):
	// a nested loop over 10,000 lines stops here instead of running 10^8.
	maxTicks = 1_000_000
	// ctxEvery is how many ticks pass between context checks.
	ctxEvery = 256
)

// allowedBuiltins are the expr builtins templates may use: pure, with
// output bounded by their input. Left out on purpose: now, date, timezone
// (wall clock); repeat, replace, join, reduce, concat, flatten (output can
// grow geometrically with nesting); toJSON, fromJSON (the body is decoded
// by the host, bounded); sort, sortBy, groupBy, uniq, reverse, toPairs,
// fromPairs (not needed to read a proxy list).
var allowedBuiltins = []string{
	// predicates over collections (each iteration ticks the budget)
	"all", "none", "any", "one", "filter", "map", "find", "findIndex",
	"findLast", "findLastIndex", "count",
	// collections
	"len", "first", "last", "get", "take", "keys", "values", "min", "max",
	// strings
	"split", "splitAfter", "trim", "trimPrefix", "trimSuffix", "lower", "upper",
	"hasPrefix", "hasSuffix", "indexOf", "lastIndexOf", "toBase64", "fromBase64",
	// conversions and numbers
	"int", "float", "string", "abs", "ceil", "floor", "round", "type", "duration",
}

// Reserved identifiers; sources using them are refused.
const (
	tickFunc  = "__tick"
	budgetVar = "__budget"
)

// budget is the per-call evaluation state a patched predicate ticks.
type budget struct {
	ctx   context.Context
	ticks int
}

var errTooManyIterations = fmt.Errorf("evaluation exceeded %d iterations", maxTicks)

func tick(args ...any) (any, error) {
	b, _ := args[0].(*budget)
	if b == nil {
		return nil, errors.New("evaluation budget missing")
	}
	b.ticks++
	if b.ticks > maxTicks {
		return nil, errTooManyIterations
	}
	if b.ticks%ctxEvery == 0 {
		if err := b.ctx.Err(); err != nil {
			return nil, err
		}
	}
	return true, nil
}

// requestEnv is what request expressions see.
type requestEnv struct {
	Params  map[string]string `expr:"params"`
	Secrets map[string]string `expr:"secrets"`
	Count   int               `expr:"count"`
	Now     int64             `expr:"now"`
	NowTime time.Time         `expr:"nowTime"`
	Budget  *budget           `expr:"__budget"`
}

// responseEnv is what response expressions see; B is any for JSON bodies
// and []string for lines.
type responseEnv[B any] struct {
	Params  map[string]string `expr:"params"`
	Now     int64             `expr:"now"`
	NowTime time.Time         `expr:"nowTime"`
	Status  int               `expr:"status"`
	Headers map[string]string `expr:"headers"`
	Body    B                 `expr:"body"`
	Budget  *budget           `expr:"__budget"`
}

// tickPatcher makes every predicate body "__tick(__budget); body": the
// sequence keeps the body's type, and the tick bounds iterations and checks
// the context. expr itself has no interrupt and counts no loop iterations.
type tickPatcher struct{}

func (tickPatcher) Visit(node *ast.Node) {
	p, ok := (*node).(*ast.PredicateNode)
	if !ok {
		return
	}
	if seq, ok := p.Node.(*ast.SequenceNode); ok && len(seq.Nodes) > 0 {
		if call, ok := seq.Nodes[0].(*ast.CallNode); ok {
			if id, ok := call.Callee.(*ast.IdentifierNode); ok && id.Value == tickFunc {
				return // already patched (visitors may run more than once)
			}
		}
	}
	p.Node = &ast.SequenceNode{Nodes: []ast.Node{
		&ast.CallNode{
			Callee:    &ast.IdentifierNode{Value: tickFunc},
			Arguments: []ast.Node{&ast.IdentifierNode{Value: budgetVar}},
		},
		p.Node,
	}}
}

// declared is what a template declares, for the pre-scan.
type declared struct {
	params  map[string]bool
	secrets map[string]bool
}

// prescan refuses what the type checker cannot: reserved names, and
// params.X / secrets.X for an X the template did not declare.
func prescan(src string, d declared) error {
	tree, err := parser.Parse(src)
	if err != nil {
		return err
	}
	var errs []string
	ast.Walk(&tree.Node, visitorFunc(func(n *ast.Node) {
		switch v := (*n).(type) {
		case *ast.IdentifierNode:
			if strings.HasPrefix(v.Value, "__") {
				errs = append(errs, "identifier "+v.Value+" is reserved")
			}
		case *ast.MemberNode:
			prop, ok := v.Property.(*ast.StringNode)
			if !ok {
				return
			}
			if strings.HasPrefix(prop.Value, "__") {
				errs = append(errs, "field "+prop.Value+" is reserved")
			}
			id, ok := v.Node.(*ast.IdentifierNode)
			if !ok {
				return
			}
			switch id.Value {
			case "params":
				if !d.params[prop.Value] {
					errs = append(errs, "params."+prop.Value+" is not declared in params")
				}
			case "secrets":
				if !d.secrets[prop.Value] {
					errs = append(errs, "secrets."+prop.Value+" is not declared in secrets")
				}
			}
		}
	}))
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; "))
	}
	return nil
}

type visitorFunc func(*ast.Node)

func (f visitorFunc) Visit(n *ast.Node) { f(n) }

// compileExpr compiles one expression against env, expecting a result of
// kind want (reflect.Invalid for any).
func compileExpr(s source, env any, want reflect.Kind, d declared) (*vm.Program, error) {
	if len(s.Src) > MaxExprBytes {
		return nil, fmt.Errorf("expression longer than %d bytes", MaxExprBytes)
	}
	if err := prescan(s.Src, d); err != nil {
		return nil, err
	}
	opts := make([]exprlang.Option, 0, 8+len(allowedBuiltins)+len(helpers))
	opts = append(opts, exprlang.Env(env), exprlang.DisableAllBuiltins())
	for _, b := range allowedBuiltins {
		opts = append(opts, exprlang.EnableBuiltin(b))
	}
	opts = append(opts, exprlang.MaxNodes(MaxNodes))
	for _, h := range helpers {
		opts = append(opts, exprlang.Function(h.name, h.fn, h.types...))
	}
	opts = append(opts,
		exprlang.Function(tickFunc, tick, new(func(*budget) bool)),
		exprlang.Patch(tickPatcher{}),
	)
	if want != reflect.Invalid {
		opts = append(opts, exprlang.AsKind(want))
	}
	return exprlang.Compile(s.Src, opts...)
}

// run evaluates p on a VM whose memory budget is fresh for each call.
func run(m *vm.VM, p *vm.Program, env any) (any, error) {
	m.MemoryBudget = memoryBudget
	return m.Run(p, env)
}
