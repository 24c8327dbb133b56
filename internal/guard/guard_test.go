package guard

import (
	"io"
	"log/slog"
	"testing"

	"github.com/ortbus/ortbus/codec"
)

func TestRecoverCountsAndAnswers(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	before := Panics()
	var got *codec.Error
	func() {
		defer Recover(log, "test", func(e *codec.Error) { got = e })
		var m map[string]int
		m["x"] = 1 // panics: assignment to a nil map
	}()
	if got == nil || got.Code != codec.CodeInternal || Panics() != before+1 {
		t.Fatalf("answer %+v, panics %d -> %d", got, before, Panics())
	}
	// No panic: no answer, no count.
	got = nil
	func() { defer Recover(log, "test", func(e *codec.Error) { got = e }) }()
	if got != nil || Panics() != before+1 {
		t.Fatal("Recover acted without a panic")
	}
	// An answer that panics too is contained.
	func() {
		defer Recover(log, "test", func(*codec.Error) { panic("again") })
		panic("first")
	}()
}
