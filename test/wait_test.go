package test

import (
	"encoding/json"
	"time"

	"github.com/ortbus/ortbus/codec"
	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// checkFor is testenv.CheckFor, the one polling wait of the tests.
var checkFor = testenv.CheckFor

// pollEvery is how often checkFor's callers poll state that has no push event.
const pollEvery = 20 * time.Millisecond

// lastStatus is the error of a status poll that ok has not accepted yet: the last status
// seen, written out (as indented JSON) only when the wait fails.
type lastStatus struct{ st *codec.StatusReply }

func (e lastStatus) Error() string {
	b, _ := json.MarshalIndent(e.st, "", "  ")
	return "last status:\n" + string(b)
}
