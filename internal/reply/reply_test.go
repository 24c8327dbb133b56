package reply

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/ortbus/ortbus/codec"
)

func TestErrorRoundTrip(t *testing.T) {
	for _, asJSON := range []bool{false, true} {
		e := codec.Errorf(codec.CodeForbiddenPath, "no\r\nway").With("path", "/x")
		m := Error("_INBOX.a.b", e, asJSON)
		if m.Header.Get(HeaderErrorCode) != "403" || strings.ContainsAny(m.Header.Get(HeaderError), "\r\n") {
			t.Fatalf("headers %v", m.Header)
		}
		got := ErrorOf(m)
		if got == nil || got.Code != codec.CodeForbiddenPath || got.Details["path"] != "/x" {
			t.Fatalf("json=%v: read back %+v", asJSON, got)
		}
		if ErrorOf(Result("s", []byte{0x80}, asJSON)) != nil {
			t.Fatal("a result read as an error")
		}
	}
	// An error reply whose body is not a contract error: internal, keeping the status.
	m := nats.NewMsg("s")
	m.Header.Set(HeaderErrorCode, "503")
	m.Header.Set(HeaderError, "gone")
	m.Data = []byte{0xc1}
	if e := ErrorOf(m); e.Code != codec.CodeInternal || e.Details["status"] != 503 {
		t.Fatalf("foreign error %+v", e)
	}
}

// A reply over the bus's limit is answered reply_too_large, never dropped or cut.
func TestFit(t *testing.T) {
	small := Result("s", []byte{0x80}, false)
	if Fit(small, 1<<20) != small {
		t.Fatal("a small reply was replaced")
	}
	big := Result("s", bytes.Repeat([]byte{1}, 1<<20), true)
	got := Fit(big, 1<<20)
	e := ErrorOf(got)
	if e == nil || e.Code != codec.CodeReplyTooLarge || got.Header.Get(codec.HeaderContentType) != codec.ContentTypeJSON || len(got.Data) > 1024 {
		t.Fatalf("fitted %v / %+v (%d bytes)", got.Header, e, len(got.Data))
	}
	// It names the alternative: the outputs written as files.
	if !strings.Contains(e.Message, "output_dir") || !strings.Contains(e.Message, "output_paths") {
		t.Errorf("reply_too_large says %q, naming neither output_dir nor output_paths", e.Message)
	}
}
