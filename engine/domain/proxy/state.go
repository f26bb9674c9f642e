package proxy

import "fmt"

// State is a proxy's lifecycle state (seed 000 §6). ACTIVE and BUSY are not
// states: they are capacity counts on an AVAILABLE proxy.
type State uint8

// Lifecycle states.
const (
	StateFetched State = iota + 1
	StateChecking
	StateAvailable
	StateSuspect
	StateUnhealthy
	StateDraining
	StateExtracted
	StateExpired
	StateRemoved
)

var stateNames = [...]string{
	StateFetched:   "FETCHED",
	StateChecking:  "CHECKING",
	StateAvailable: "AVAILABLE",
	StateSuspect:   "SUSPECT",
	StateUnhealthy: "UNHEALTHY",
	StateDraining:  "DRAINING",
	StateExtracted: "EXTRACTED",
	StateExpired:   "EXPIRED",
	StateRemoved:   "REMOVED",
}

// States lists every state in lifecycle order.
func States() []State {
	return []State{StateFetched, StateChecking, StateAvailable, StateSuspect, StateUnhealthy, StateDraining, StateExtracted, StateExpired, StateRemoved}
}

func (s State) String() string {
	if int(s) < len(stateNames) && stateNames[s] != "" {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// ParseState is the inverse of String.
func ParseState(name string) (State, error) {
	for _, s := range States() {
		if stateNames[s] == name {
			return s, nil
		}
	}
	return 0, fmt.Errorf("unknown proxy state %q", name)
}

// allowed is the transition table of seed 000 §6. Anything absent is refused.
var allowed = map[State][]State{
	StateFetched:   {StateChecking},
	StateChecking:  {StateAvailable, StateUnhealthy},
	StateAvailable: {StateSuspect, StateDraining, StateExtracted},
	StateSuspect:   {StateAvailable, StateUnhealthy},
	StateDraining:  {StateExpired},
	StateUnhealthy: {StateRemoved},
	StateExtracted: {StateExpired},
	StateExpired:   {StateRemoved},
}

// TransitionError is returned for a transition the state machine refuses.
type TransitionError struct{ From, To State }

func (e *TransitionError) Error() string {
	return fmt.Sprintf("proxy state transition %s -> %s is not allowed", e.From, e.To)
}

// Transition validates from -> to. It is the only place the lifecycle rules
// live; stores call it before they write a new state.
func Transition(from, to State) error {
	for _, s := range allowed[from] {
		if s == to {
			return nil
		}
	}
	return &TransitionError{From: from, To: to}
}

// Terminal reports whether nothing follows s but removal.
func (s State) Terminal() bool { return s == StateRemoved }
