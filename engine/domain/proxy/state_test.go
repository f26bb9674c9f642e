package proxy

import (
	"errors"
	"testing"
)

func TestTransitionTable(t *testing.T) {
	want := map[[2]State]bool{
		{StateFetched, StateChecking}:    true,
		{StateChecking, StateAvailable}:  true,
		{StateChecking, StateUnhealthy}:  true,
		{StateAvailable, StateSuspect}:   true,
		{StateSuspect, StateAvailable}:   true,
		{StateSuspect, StateUnhealthy}:   true,
		{StateAvailable, StateDraining}:  true,
		{StateDraining, StateExpired}:    true,
		{StateAvailable, StateExtracted}: true,
		{StateUnhealthy, StateRemoved}:   true,
		{StateExtracted, StateExpired}:   true,
		{StateExpired, StateRemoved}:     true,
	}
	// Every pair of states, allowed or refused, is checked: a new edge in the
	// table without a matching line above fails the test.
	for _, from := range States() {
		for _, to := range States() {
			name := from.String() + "->" + to.String()
			t.Run(name, func(t *testing.T) {
				err := Transition(from, to)
				if want[[2]State{from, to}] {
					if err != nil {
						t.Fatalf("refused allowed transition: %v", err)
					}
					return
				}
				var te *TransitionError
				if !errors.As(err, &te) || te.From != from || te.To != to {
					t.Fatalf("want TransitionError, got %v", err)
				}
			})
		}
	}
}

func TestParseStateRoundTrip(t *testing.T) {
	for _, s := range States() {
		got, err := ParseState(s.String())
		if err != nil || got != s {
			t.Fatalf("ParseState(%q) = %v, %v", s.String(), got, err)
		}
	}
	if _, err := ParseState("ACTIVE"); err == nil {
		t.Fatal("ACTIVE is a capacity count, not a state")
	}
}
